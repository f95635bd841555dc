"""VGG-11 and VGG-16 as flat lists of layers (VGG-16 on ImageNet: 40 blocks, 138.4M params)."""

from __future__ import annotations

from torch import nn

from pipecast.values.data.spec import DatasetSpec

_POOL = 0
CONFIGS: dict[str, list[int]] = {
    "vgg11": [64, _POOL, 128, _POOL, 256, 256, _POOL, 512, 512, _POOL, 512, 512, _POOL],
    "vgg16": [
        64,
        64,
        _POOL,
        128,
        128,
        _POOL,
        256,
        256,
        256,
        _POOL,
        512,
        512,
        512,
        _POOL,
        512,
        512,
        512,
        _POOL,
    ],
}


def vgg(name: str, spec: DatasetSpec, *, dropout: float = 0.5) -> nn.Sequential:
    """VGG `name` for `spec`. Small images (<= 64 px) skip a pooling that would reach 0x0
    and use a 512-wide classifier, the usual CIFAR/MNIST adaptation."""
    layers: list[nn.Module] = []
    channels, size = spec.channels, spec.image_size
    for width in CONFIGS[name]:
        if width == _POOL:
            if size >= 2:
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
                size //= 2
            continue
        layers += [nn.Conv2d(channels, width, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
        channels = width
    small = spec.image_size <= 64
    pooled, hidden = (1, 512) if small else (7, 4096)
    layers += [
        nn.AdaptiveAvgPool2d(pooled),
        nn.Flatten(),
        nn.Linear(512 * pooled * pooled, hidden),
        nn.ReLU(inplace=True),
        nn.Dropout(dropout),
        nn.Linear(hidden, hidden),
        nn.ReLU(inplace=True),
        nn.Dropout(dropout),
        nn.Linear(hidden, spec.num_classes),
    ]
    return nn.Sequential(*layers)
