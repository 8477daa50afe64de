"""A small image classifier, as a user's own model would be: a factory that returns an nn.Module.

The recipe names it `recipes.examples.cnn.model:build`; the pipeline imports it from the working directory
(run from the repository root) or from PYTHONPATH, calls it with the recipe's `kwargs`, and exports it."""

from torch import nn


def build(classes: int = 10, width: int = 16) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.BatchNorm2d(2 * width),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * width, classes),
    )
