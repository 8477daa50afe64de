"""A stand-in for torchvision where the real one cannot run (beside the CPU torch here): the one entry point
the pipeline uses, `models.get_model(name, weights=None)`, building the zoo's hand-written CNNs with random
weights drawn from torch's global generator, as torchvision's own constructors do. On a host with the real
torchvision (the GPU host) the GPU zoo deploys torchvision's ResNet-50 itself."""

from torchvision import models  # noqa: F401
