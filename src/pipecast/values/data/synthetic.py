"""Seeded synthetic samples with a data set's real shapes: deterministic, never downloaded."""

from __future__ import annotations

import torch

from pipecast.values.data.spec import DatasetSpec


def synthetic_batch(
    spec: DatasetSpec,
    batch_size: int,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of inputs and targets; the same seed (and device) always gives the same
    tensors. Generated on `device` directly, so a GPU step never waits for a host copy."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    gen = torch.Generator(device=dev).manual_seed(seed)
    shape = (batch_size, *spec.sample_shape)
    if spec.input_kind == "tokens":
        inputs = torch.randint(0, spec.num_classes, shape, generator=gen, device=dev)
    else:
        inputs = torch.randn(shape, generator=gen, device=dev).to(dtype)
    target_shape = (batch_size, *spec.target_shape)
    if spec.target == "regression":
        targets = torch.randn(target_shape, generator=gen, device=dev).to(dtype)
    else:
        targets = torch.randint(0, spec.num_classes, target_shape, generator=gen, device=dev)
    return inputs, targets
