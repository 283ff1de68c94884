"""Stand-ins, in the on-disk formats Graphcore's examples read, for the data sets and the model
they would download: MNIST and FashionMNIST (torchvision's raw IDX files), CIFAR-10 (its Python
pickle batches), the basics tutorial's ``images/trousers.jpg``, and a randomly initialised
``mrm8488/bert-medium-finetuned-squadv2`` in the Hugging Face hub cache.

    python examples/graphcore/fake_datasets.py --home DIR [--train 2000 --test 500] [--bert]

Images are made so that the classes can be learned: each class draws a bright block at its own
place on a noisy background, so a working training loop reaches high accuracy within an epoch
and a broken one stays near 10 %. Files go where the examples look with ``HOME=DIR``:
``DIR/.torch/datasets`` and ``DIR/.cache/huggingface/hub``.
"""
import argparse
import json
import os
import pickle
import struct

import numpy as np

MNIST_LIKE = ("MNIST", "FashionMNIST")
CIFAR_LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def class_images(count: int, size: int, channels: int, seed: int):
    """``count`` uint8 images of ``channels x size x size`` and their labels (0-9)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, count)
    images = rng.integers(0, 60, (count, channels, size, size), dtype=np.uint8)
    block = size // 4
    for index, label in enumerate(labels):
        row, col = divmod(int(label), 4)
        top, left = block // 2 + row * block, block // 2 + col * (size - 2 * block) // 3
        images[index, :, top:top + block, left:left + block] = 200 + rng.integers(0, 55)
    return images, labels.astype(np.uint8)


def write_idx(path: str, array: np.ndarray) -> None:
    """An IDX file (big-endian dims after a 0x08 uint8 type code), as MNIST ships it."""
    with open(path, "wb") as stream:
        stream.write(struct.pack(">HBB", 0, 0x08, array.ndim))
        stream.write(struct.pack(f">{array.ndim}I", *array.shape))
        stream.write(np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def mnist_like(datasets_dir: str, name: str, train: int, test: int) -> None:
    raw = os.path.join(datasets_dir, name, "raw")
    os.makedirs(raw, exist_ok=True)
    for prefix, count, seed in (("train", train, 1), ("t10k", test, 2)):
        images, labels = class_images(count, 28, 1, seed + len(name))
        write_idx(os.path.join(raw, f"{prefix}-images-idx3-ubyte"), images[:, 0])
        write_idx(os.path.join(raw, f"{prefix}-labels-idx1-ubyte"), labels)


def cifar10(datasets_dir: str, train: int, test: int) -> None:
    """``cifar-10-batches-py``: five training batches, one test batch and ``batches.meta``.

    torchvision checks these files' MD5 sums; stand-ins can't match them, so reading them needs
    that check switched off (see README.md)."""
    folder = os.path.join(datasets_dir, "cifar-10-batches-py")
    os.makedirs(folder, exist_ok=True)
    per_batch = -(-train // 5)
    for batch in range(5):
        images, labels = class_images(per_batch, 32, 3, 10 + batch)
        _dump(os.path.join(folder, f"data_batch_{batch + 1}"), images, labels)
    images, labels = class_images(test, 32, 3, 20)
    _dump(os.path.join(folder, "test_batch"), images, labels)
    with open(os.path.join(folder, "batches.meta"), "wb") as stream:
        pickle.dump({"label_names": CIFAR_LABELS, "num_cases_per_batch": per_batch, "num_vis": 3072}, stream)


def _dump(path: str, images: np.ndarray, labels: np.ndarray) -> None:
    with open(path, "wb") as stream:
        pickle.dump({"data": images.reshape(len(images), -1), "labels": labels.tolist()}, stream)


def trousers_jpg(path: str) -> None:
    """A dark pair of trousers on a white background (the basics tutorial's photo is 'trousers.jpg')."""
    from PIL import Image, ImageDraw
    os.makedirs(os.path.dirname(path), exist_ok=True)
    image = Image.new("RGB", (280, 280), "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle((90, 30, 190, 70), fill=(40, 40, 60))
    draw.polygon([(90, 70), (135, 70), (125, 260), (85, 260)], fill=(40, 40, 60))
    draw.polygon([(145, 70), (190, 70), (195, 260), (155, 260)], fill=(40, 40, 60))
    image.save(path, "JPEG")


def bert_squad(hub_dir: str, repo_id: str = "mrm8488/bert-medium-finetuned-squadv2") -> None:
    """A BERT-medium question-answering model with random weights and a character-level
    WordPiece vocabulary, laid out as the hub cache holds a downloaded snapshot (use it with
    ``HF_HUB_OFFLINE=1``). Answers are meaningless; the code path is the real one."""
    import torch
    import transformers
    snapshot = "0" * 40
    model_dir = os.path.join(hub_dir, "models--" + repo_id.replace("/", "--"))
    target = os.path.join(model_dir, "snapshots", snapshot)
    os.makedirs(target, exist_ok=True)
    os.makedirs(os.path.join(model_dir, "refs"), exist_ok=True)
    with open(os.path.join(model_dir, "refs", "main"), "w") as stream:
        stream.write(snapshot)
    symbols = [chr(c) for c in range(33, 127) if not chr(c).isupper()]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + symbols + ["##" + s for s in symbols]
    with open(os.path.join(target, "vocab.txt"), "w") as stream:
        stream.write("\n".join(vocab) + "\n")
    with open(os.path.join(target, "tokenizer_config.json"), "w") as stream:
        json.dump({"do_lower_case": True, "model_max_length": 512, "tokenizer_class": "BertTokenizer"}, stream)
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=512, num_hidden_layers=8,
                                     num_attention_heads=8, intermediate_size=2048)
    torch.manual_seed(0)
    transformers.BertForQuestionAnswering(config).save_pretrained(target)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", required=True, help="the HOME the examples will run with")
    parser.add_argument("--train", type=int, default=2000, help="training images per data set")
    parser.add_argument("--test", type=int, default=500, help="test images per data set")
    parser.add_argument("--bert", action="store_true", help="also write the BERT question-answering stand-in")
    parser.add_argument("--trousers", metavar="PATH", help="also write the basics tutorial's trousers.jpg here")
    args = parser.parse_args()
    datasets_dir = os.path.join(args.home, ".torch", "datasets")
    for name in MNIST_LIKE:
        mnist_like(datasets_dir, name, args.train, args.test)
    cifar10(datasets_dir, args.train, args.test)
    if args.trousers:
        trousers_jpg(args.trousers)
    if args.bert:
        bert_squad(os.path.join(args.home, ".cache", "huggingface", "hub"))
    print(f"stand-in data sets in {datasets_dir}")


if __name__ == "__main__":
    main()
