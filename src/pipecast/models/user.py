"""A user's own model, imported from 'package.module:factory' or given as modules."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Sequence

from torch import nn

from pipecast.data.spec import DatasetSpec
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


def is_factory_path(name: str) -> bool:
    return ":" in name


def load_factory_model(path: str, spec: DatasetSpec) -> nn.Sequential:
    """Call the factory at 'package.module:function' (with the DatasetSpec if it takes an
    argument) and return its blocks."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"model '{path}' must look like package.module:factory")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import '{module_name}' for --model {path}: {exc}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(f"'{module_name}' has no callable '{attr}' (from --model {path})")
    try:
        takes_spec = len(inspect.signature(factory).parameters) > 0
    except (TypeError, ValueError):
        takes_spec = False
    model = factory(spec) if takes_spec else factory()
    return as_sequential(model, origin=f"factory {path}")
