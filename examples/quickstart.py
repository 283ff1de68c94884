"""Train a small classifier with PopTorch's API on openpop.

Device iterations, gradient accumulation and replication are all on: each host call runs
``--device-iterations`` optimizer steps, each over ``--gradient-accumulation`` x ``--replicas``
micro-batches. Data is synthetic (two Gaussian blobs per class), so nothing is downloaded.

    python examples/quickstart.py --epochs 3
"""
import argparse
import time

import torch

import poptorch


class Classifier(torch.nn.Module):
    def __init__(self, features: int, classes: int, hidden: int = 128):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(features, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, classes))
        self.loss = torch.nn.CrossEntropyLoss()

    def forward(self, x, labels=None):
        logits = self.net(x)
        if labels is None:
            return logits
        return logits, self.loss(logits, labels)


def synthetic_dataset(samples: int, features: int, classes: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, features, generator=generator) * 0.6
    labels = torch.randint(0, classes, (samples,), generator=generator)
    x = centres[labels] + torch.randn(samples, features, generator=generator)
    return torch.utils.data.TensorDataset(x, labels)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--micro-batch-size", type=int, default=16)
    parser.add_argument("--device-iterations", type=int, default=8)
    parser.add_argument("--gradient-accumulation", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--samples", type=int, default=32768)
    args = parser.parse_args()

    features, classes = 32, 10
    opts = poptorch.Options()
    opts.deviceIterations(args.device_iterations)
    opts.replicationFactor(args.replicas)
    opts.Training.gradientAccumulation(args.gradient_accumulation)
    opts.randomSeed(0)

    dataset = synthetic_dataset(args.samples, features, classes)
    loader = poptorch.DataLoader(opts, dataset, batch_size=args.micro_batch_size, shuffle=True)
    model = Classifier(features, classes)
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    training_model = poptorch.trainingModel(model, opts, optimizer)

    print(f"combined batch: {loader.combinedBatchSize} samples per host call "
          f"(micro {args.micro_batch_size} x DI {args.device_iterations} x GA {args.gradient_accumulation} "
          f"x R {args.replicas}), {len(loader)} host calls per epoch")
    for epoch in range(args.epochs):
        start, seen, total_loss = time.perf_counter(), 0, 0.0
        for x, labels in loader:
            _, loss = training_model(x, labels)
            total_loss += float(loss.mean())
            seen += x.shape[0]
        elapsed = time.perf_counter() - start
        print(f"epoch {epoch + 1}/{args.epochs}: loss {total_loss / len(loader):.4f}  "
              f"throughput {seen / elapsed:,.0f} samples/s")

    inference_model = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(args.device_iterations))
    x, labels = dataset[:args.device_iterations * 256]
    accuracy = (inference_model(x).argmax(dim=1) == labels).float().mean()
    print(f"accuracy on {x.shape[0]} training samples: {accuracy:.1%}")


if __name__ == "__main__":
    main()
