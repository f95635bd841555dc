"""A labelled data set held in memory, with seeded shuffling into batches."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from pipecast.errors import ConfigError


@dataclass(frozen=True)
class ArrayData:
    """Inputs and targets of equal length, e.g. a real data set read from disk."""

    inputs: torch.Tensor
    targets: torch.Tensor

    def __post_init__(self) -> None:
        if len(self.inputs) != len(self.targets):
            raise ConfigError(
                f"inputs and targets differ in length ({len(self.inputs)} vs {len(self.targets)})"
            )

    def __len__(self) -> int:
        return len(self.inputs)

    def batches(
        self, batch_size: int, *, seed: int = 0, drop_last: bool = True
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Shuffled batches, the same order for the same seed."""
        if batch_size < 1:
            raise ConfigError(f"batch size must be at least 1, got {batch_size}")
        order = torch.randperm(len(self), generator=torch.Generator().manual_seed(seed))
        stop = len(self) - len(self) % batch_size if drop_last else len(self)
        for start in range(0, stop, batch_size):
            idx = order[start : start + batch_size]
            yield self.inputs[idx], self.targets[idx]

    def epochs(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Shuffled batches without end, epoch after epoch, epoch e shuffled with seed e
        (each epoch's last partial batch dropped)."""
        if batch_size > len(self):
            raise ConfigError(f"batch {batch_size} is larger than the data set ({len(self)})")
        epoch = 0
        while True:
            yield from self.batches(batch_size, seed=epoch)
            epoch += 1

    def split(self, fraction: float, *, seed: int = 0) -> tuple[ArrayData, ArrayData]:
        """A seeded split into (first `fraction`, rest)."""
        order = torch.randperm(len(self), generator=torch.Generator().manual_seed(seed))
        cut = round(len(self) * fraction)
        head, tail = order[:cut], order[cut:]
        return (
            ArrayData(self.inputs[head], self.targets[head]),
            ArrayData(self.inputs[tail], self.targets[tail]),
        )
