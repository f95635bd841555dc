"""ResNet-18/50/152: a stem, one block per residual block, then pooling and the classifier."""

from __future__ import annotations

import torch
from torch import nn

from pipecast.values.data.spec import DatasetSpec


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with an identity (or 1x1 projection) shortcut."""

    expansion = 1

    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, out_ch, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = _projection(in_ch, out_ch, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        result: torch.Tensor = self.relu(out + self.shortcut(x))
        return result


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand by 4, with a shortcut."""

    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = _projection(in_ch, out_ch, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        result: torch.Tensor = self.relu(out + self.shortcut(x))
        return result


def _projection(in_ch: int, out_ch: int, stride: int) -> nn.Module:
    if stride == 1 and in_ch == out_ch:
        return nn.Identity()
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
    )


DEPTHS: dict[str, tuple[type[BasicBlock] | type[Bottleneck], tuple[int, int, int, int]]] = {
    "resnet18": (BasicBlock, (2, 2, 2, 2)),
    "resnet50": (Bottleneck, (3, 4, 6, 3)),
    "resnet152": (Bottleneck, (3, 8, 36, 3)),
}


def resnet(name: str, spec: DatasetSpec) -> nn.Sequential:
    """ResNet `name`. Small images (<= 64 px) get a 3x3 stride-1 stem and no max-pool."""
    block, counts = DEPTHS[name]
    if spec.image_size <= 64:
        stem = nn.Sequential(
            nn.Conv2d(spec.channels, 64, 3, padding=1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
        )
    else:
        stem = nn.Sequential(
            nn.Conv2d(spec.channels, 64, 7, stride=2, padding=3, bias=False),  # (B,64,H/2,W/2)
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),  # (B, 64, H/4, W/4)
        )
    blocks: list[nn.Module] = [stem]
    in_ch = 64
    for stage, count in enumerate(counts):
        width = 64 * 2**stage
        for i in range(count):
            stride = 2 if (stage > 0 and i == 0) else 1
            blocks.append(block(in_ch, width, stride))
            in_ch = width * block.expansion
    blocks += [
        nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()),
        nn.Linear(in_ch, spec.num_classes),
    ]
    return nn.Sequential(*blocks)
