"""What a stage of blocks holds beyond its saved activations, derived from its blocks'
costs: the eager backward's transient peak, and a CUDA-graph slot's fullest in the
allocator's small and large requests apart (pipecast.hardware.allocator)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipecast.hardware.allocator import SMALL_REQUEST

if TYPE_CHECKING:
    from pipecast.profile.types import BlockCost, BlockProfile


def backward_peak(costs: list[BlockCost], saved: list[float], start: int, stop: int) -> int:
    """Bytes a stage needs beyond holding all its saved activations. The backward runs from
    the last block down and frees each block's activations as it passes, so when block i
    needs its transient memory, the blocks after it have already given theirs back."""
    return max(
        max(int(costs[i].peak_bytes - (saved[stop] - saved[i + 1])), 0) for i in range(start, stop)
    )


def graph_slot(
    blocks: tuple[BlockProfile, ...],
    costs: list[BlockCost],
    t: dict[str, list[float]],
    start: int,
    stop: int,
    held: int,
) -> dict[str, int]:
    """What one captured slot of blocks [start, stop) holds at its fullest, in small and
    in large allocator requests apart (each kind at its own fullest: the allocator never
    serves one from the other's segments), `held` received input bytes included: every
    saved activation after the forward; in the backward, from the last block down, the
    activations not yet freed, the parameter gradients returned so far (a graphed backward
    hands them all back at its end, to be added to `.grad`) and the block's transient
    memory beyond its own gradients."""
    saved, param = t["saved"], t["param"]
    saved_large, param_large = t["saved_large"], t["param_large"]
    worst_small = (saved[stop] - saved_large[stop]) - (saved[start] - saved_large[start])
    worst_large = saved_large[stop] - saved_large[start]
    for i in range(start, stop):
        transient = max(costs[i].peak_bytes - blocks[i].param_bytes, 0)
        big = transient if transient > SMALL_REQUEST else 0
        large = saved_large[i + 1] - saved_large[start] + param_large[stop] - param_large[i]
        every = saved[i + 1] - saved[start] + param[stop] - param[i]
        worst_large = max(worst_large, large + big)
        worst_small = max(worst_small, every - large + transient - big)
    if held > SMALL_REQUEST:
        worst_large += held
    else:
        worst_small += held
    return {"graph_slot_small": int(worst_small), "graph_slot_large": int(worst_large)}
