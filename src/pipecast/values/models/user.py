"""A user's own blocks, given as an nn.Sequential or a list of modules."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from pipecast.errors import ConfigError


def as_sequential(model: object, origin: str = "the model") -> nn.Sequential:
    """`model` as nn.Sequential: an nn.Sequential as is, a list/tuple of modules wrapped."""
    if isinstance(model, nn.Sequential):
        return model
    if isinstance(model, Sequence) and model and all(isinstance(m, nn.Module) for m in model):
        return nn.Sequential(*model)
    raise ConfigError(
        f"{origin} must be an nn.Sequential or a non-empty list of nn.Modules, got "
        f"{type(model).__name__}: wrap your blocks in nn.Sequential"
    )
