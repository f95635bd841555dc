"""Splitting a batch into micro-batches: tensors, tuples/lists and dicts of tensors."""

from __future__ import annotations

from typing import Any

import torch

from pipecast.errors import ConfigError


def split(batch: Any, chunks: int) -> list[Any]:
    """`chunks` micro-batches along dim 0 (sizes differ by at most one sample)."""
    if isinstance(batch, torch.Tensor):
        if batch.shape[0] < chunks:
            raise ConfigError(
                f"a batch of {batch.shape[0]} samples cannot make {chunks} "
                "micro-batches: use fewer micro-batches or a larger batch"
            )
        return list(torch.tensor_split(batch, chunks))
    if isinstance(batch, tuple | list):
        parts = [split(item, chunks) for item in batch]
        return [type(batch)(p[i] for p in parts) for i in range(chunks)]
    if isinstance(batch, dict):
        parts_by_key = {k: split(v, chunks) for k, v in batch.items()}
        return [{k: v[i] for k, v in parts_by_key.items()} for i in range(chunks)]
    raise ConfigError(
        f"cannot split a {type(batch).__name__} into micro-batches: pass tensors, "
        "tuples/lists or dicts of tensors"
    )


def size(batch: Any) -> int:
    """Samples in a (micro-)batch: dim 0 of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    if isinstance(batch, tuple | list):
        return size(batch[0])
    if isinstance(batch, dict):
        return size(next(iter(batch.values())))
    raise ConfigError(f"cannot take the size of a {type(batch).__name__}")


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple | list):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def shapes(batch: Any) -> list[tuple[int, ...]]:
    if isinstance(batch, torch.Tensor):
        return [tuple(batch.shape)]
    if isinstance(batch, tuple | list):
        return [s for b in batch for s in shapes(b)]
    if isinstance(batch, dict):
        return [s for v in batch.values() for s in shapes(v)]
    return []
