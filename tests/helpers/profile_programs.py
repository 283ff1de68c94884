"""A program the profile tests launch under poprun: ``python profile_programs.py`` trains a
small model for 2 host calls with ``POPLAR_ENGINE_OPTIONS`` from the environment."""
import torch
import torch.nn.functional as F


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x, y):
        out = self.fc(x)
        return out, F.cross_entropy(out, y)


def main():
    import popdist
    import popdist.poptorch
    import poptorch
    popdist.init()
    torch.manual_seed(0)
    options = popdist.poptorch.Options(ipus_per_replica=1)
    options.Training.gradientAccumulation(2)
    options.showCompilationProgressBar(False)
    model = Net()
    training = poptorch.trainingModel(model, options, torch.optim.SGD(model.parameters(), lr=0.1))
    for _ in range(2):
        training(torch.randn(4, 8), torch.randint(0, 4, (4,)))
    training.destroy()


if __name__ == "__main__":
    main()
