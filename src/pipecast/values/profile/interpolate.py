"""Costs at micro-batch sizes a profile did not measure.

Device times are piecewise linear in the micro-batch size between the sizes measured (each
size's time capped by every larger size's: timing noise only lengthens a sample); bytes are
exactly proportional; host times are the smallest size's, since issuing a block's ops costs
the host the same at any size (docs/decisions.md, "Host costs at the smallest size").
"""

from __future__ import annotations

import bisect
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipecast.values.profile.types import BlockCost


def interp(xs: list[int], ys: list[float], x: int) -> float:
    """Piecewise-linear through (xs, ys); beyond the ends, the nearest segment's line
    (one point: proportional). Never below zero."""
    if len(xs) == 1:
        return ys[0] * x / xs[0]
    i = bisect.bisect_left(xs, x)
    if i < len(xs) and xs[i] == x:
        return ys[i]
    lo = min(max(i - 1, 0), len(xs) - 2)
    x0, x1, y0, y1 = xs[lo], xs[lo + 1], ys[lo], ys[lo + 1]
    value = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    if x < xs[0]:  # below the smallest size: never faster than proportional scaling
        value = max(value, ys[0] * x / xs[0])
    return max(value, 0.0)


def monotone(ys: list[float]) -> list[float]:
    """Times at rising micro-batch sizes, each capped by every larger size's: a smaller
    micro-batch never takes longer. Timing noise is one-sided (a host stall, a clock dip,
    an allocator call only lengthen a sample), so a small size measured slower than a larger
    one is noise, and the larger size's time bounds it."""
    out = list(ys)
    for i in range(len(out) - 2, -1, -1):
        out[i] = min(out[i], out[i + 1])
    return out


_DEVICE = (
    "forward",
    "backward_input",
    "backward_weight",
    "batched_weight",
    "backward",
    "graph_forward",
    "graph_backward",
)
_HOST = ("host_forward", "host_backward_input", "host_backward_weight", "host_backward")
_BYTES = ("output_bytes", "saved_bytes", "peak_bytes", "held_bytes", "graph_pool")


def block_cost(costs: dict[int, BlockCost], micro_batch: int) -> BlockCost:
    """One block's cost at `micro_batch`, from its measured sizes."""
    sizes = sorted(costs)
    near = min(sizes, key=lambda s: abs(s - micro_batch))
    base = costs[near]
    if len(sizes) == 1 and micro_batch == near:
        return base

    def device(name: str) -> float:
        return interp(sizes, monotone([getattr(costs[s], name) for s in sizes]), micro_batch)

    def scaled(n: int) -> int:
        return n * micro_batch // near if micro_batch != near else n

    values: dict[str, Any] = {name: device(name) for name in _DEVICE}
    values |= {name: float(getattr(costs[sizes[0]], name)) for name in _HOST}
    values |= {name: scaled(getattr(base, name)) for name in _BYTES}
    if base.selective_bytes is not None:
        values["selective_bytes"] = scaled(base.selective_bytes)
    return replace(base, **values)
