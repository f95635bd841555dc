"""Model factories that fail, for --model tests.cli.broken_models:NAME."""

from __future__ import annotations

from torch import nn

from pipecast.values.data.spec import DatasetSpec


def raises(spec: DatasetSpec) -> nn.Module:
    raise RuntimeError(f"no weights for {spec.name}\nsecond line of the message")


def raises_without_spec() -> nn.Module:
    raise KeyError("layer4")
