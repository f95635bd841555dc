"""How long an action takes when its host issues it block by block.

A host issues an action's blocks in program order and its device runs each block's kernels
once the host has begun issuing them, after the blocks before. Where the blocks alternate
between host-bound and device-bound, the device idles through the host-bound ones and the
host has no lead left when a device-heavy block follows, so the action takes longer than
its host time or its device time alone: a backward whose host and device times are equal
can span half as long again (docs/decisions.md, "Block-by-block spans").
"""

from __future__ import annotations

from collections.abc import Sequence


def span(blocks: Sequence[tuple[float, float]]) -> float:
    """Seconds from when the host begins issuing `blocks` ((host, device) seconds each, in
    issue order) until the device has run them all, its device idle at the start: the
    host's total, or the host's time before some block k plus the device's from k on,
    whichever is longest. Equals max(host total, device total) for one block."""
    host_before = 0.0
    device_from = sum(d for _, d in blocks)
    longest = 0.0
    for h, d in blocks:
        longest = max(longest, host_before + device_from)
        host_before += h
        device_from -= d
    return max(longest, host_before)


def fitted(
    blocks: Sequence[tuple[float, float]], host: float, device: float, *, extra_first: bool
) -> list[tuple[float, float]]:
    """`blocks` made to add up to an action's totals (`host`, `device`): what the totals
    hold beyond the blocks (the loss, the runtime's cuts of a split backward) as one more
    block, first or last; where the blocks hold more than the total, they are scaled down
    to it."""
    hs, ds = sum(h for h, _ in blocks), sum(d for _, d in blocks)
    kh = max(host, 0.0) / hs if hs > host else 1.0
    kd = max(device, 0.0) / ds if ds > device else 1.0
    rest = (max(host - hs, 0.0), max(device - ds, 0.0))
    scaled = [(h * kh, d * kd) for h, d in blocks]
    return [rest, *scaled] if extra_first else [*scaled, rest]
