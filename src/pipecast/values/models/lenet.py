"""LeNet-5: two convolutions and three fully connected layers, one block per layer."""

from __future__ import annotations

from torch import nn

from pipecast.values.data.spec import DatasetSpec


def lenet5(spec: DatasetSpec) -> nn.Sequential:
    """LeNet-5 for `spec`'s images; 28x28 inputs are padded so conv1 sees 32x32 as in 1998."""
    pad = 2 if spec.image_size == 28 else 0
    layers: list[nn.Module] = [
        nn.Conv2d(spec.channels, 6, kernel_size=5, padding=pad),  # (B, 6, 28, 28)
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),  # (B, 6, 14, 14)
        nn.Conv2d(6, 16, kernel_size=5),  # (B, 16, 10, 10)
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),  # (B, 16, 5, 5)
    ]
    if spec.image_size > 32:  # large images: pool to LeNet's 5x5 before the classifier
        layers.append(nn.AdaptiveAvgPool2d(5))
    layers += [
        nn.Flatten(),  # (B, 400)
        nn.Linear(16 * 5 * 5, 120),
        nn.ReLU(inplace=True),
        nn.Linear(120, 84),
        nn.ReLU(inplace=True),
        nn.Linear(84, spec.num_classes),
    ]
    return nn.Sequential(*layers)
