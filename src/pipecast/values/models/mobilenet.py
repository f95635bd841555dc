"""MobileNetV2: stem, 17 inverted residual blocks, a 1x1 expansion, pooling, classifier."""

from __future__ import annotations

import torch
from torch import nn

from pipecast.values.data.spec import DatasetSpec

# (expansion t, output channels c, repeats n, first stride s), as in the paper's Table 2
SETTINGS = [
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
]


def _conv_bn(in_ch: int, out_ch: int, kernel: int, stride: int, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out_ch),
        nn.ReLU6(inplace=True),
    )


class InvertedResidual(nn.Module):
    """Expand 1x1, depthwise 3x3, project 1x1; residual when shapes agree."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = in_ch * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(_conv_bn(in_ch, hidden, 1, 1))
        layers += [
            _conv_bn(hidden, hidden, 3, stride, groups=hidden),
            nn.Conv2d(hidden, out_ch, 1, bias=False),
            nn.BatchNorm2d(out_ch),
        ]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and in_ch == out_ch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.body(x)
        return x + out if self.residual else out


def mobilenet_v2(spec: DatasetSpec, *, dropout: float = 0.2) -> nn.Sequential:
    """MobileNetV2 (3.5M params at 1000 classes). Small images (<= 64 px) keep stride 1 in
    the stem and the first downsampling stage."""
    small = spec.image_size <= 64
    blocks: list[nn.Module] = [_conv_bn(spec.channels, 32, 3, 1 if small else 2)]
    in_ch = 32
    for index, (t, c, n, s) in enumerate(SETTINGS):
        for i in range(n):
            stride = s if i == 0 else 1
            if small and index == 1:
                stride = 1
            blocks.append(InvertedResidual(in_ch, c, stride, t))
            in_ch = c
    blocks += [
        _conv_bn(in_ch, 1280, 1, 1),
        nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()),
        nn.Sequential(nn.Dropout(dropout), nn.Linear(1280, spec.num_classes)),
    ]
    return nn.Sequential(*blocks)
