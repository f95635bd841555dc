"""What a stage of blocks holds beyond its saved activations, derived from its blocks'
costs: the backward's transient peak."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipecast.values.profile.types import BlockCost


def backward_peak(costs: list[BlockCost], saved: list[float], start: int, stop: int) -> int:
    """Bytes a stage needs beyond holding all its saved activations. The backward runs from
    the last block down and frees each block's activations as it passes, so when block i
    needs its transient memory, the blocks after it have already given theirs back."""
    return max(
        max(int(costs[i].peak_bytes - (saved[stop] - saved[i + 1])), 0) for i in range(start, stop)
    )
