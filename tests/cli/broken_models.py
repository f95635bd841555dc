"""Model factories that fail, for --model tests.cli.broken_models:NAME."""

from __future__ import annotations

import torch
from torch import nn

from pipecast.values.data.spec import DatasetSpec


def raises(spec: DatasetSpec) -> nn.Module:
    raise RuntimeError(f"no weights for {spec.name}\nsecond line of the message")


def raises_without_spec() -> nn.Module:
    raise KeyError("layer4")


class _DataDependent(nn.Module):
    """Branches on its input's values: torch.export cannot capture it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.head = nn.Linear(4 * 26 * 26, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        if x.sum() > 0:
            x = x * 2
        return self.head(x.flatten(1))


def dynamic() -> nn.Module:
    return _DataDependent()
