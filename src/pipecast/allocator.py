"""What a CUDA graph's memory pool reserves for what it holds: whole allocator segments.

torch's caching allocator serves requests of at most 1 MiB from 2 MiB segments and larger
ones from 20 MiB segments (a request of 10 MiB or more gets a segment of its own, rounded to
2 MiB), and a private pool never borrows another's. Each slot of a graphed stage captures
into a pool of its own (pipecast.runtime.graphs), so a slot that holds a few MiB reserves
22: VGG-16/CIFAR-10's first stage at micro-batch 4, 32 slots to a rank, held 20.5 MiB a
slot beyond what its tensors add up to (h200x4-graphs-run1).
"""

from __future__ import annotations

import math

SMALL_SEGMENT = 2 * 2**20
LARGE_SEGMENT = 20 * 2**20


def pool_reserved(held: float) -> int:
    """Bytes a private pool reserves to hold `held` bytes at its fullest: one small segment,
    and as many large ones as the rest needs (none below a small segment's worth)."""
    if held <= 0:
        return 0
    if held <= SMALL_SEGMENT:
        return SMALL_SEGMENT
    return SMALL_SEGMENT + math.ceil(held / LARGE_SEGMENT) * LARGE_SEGMENT
