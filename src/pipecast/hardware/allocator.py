"""What a CUDA graph's memory pool reserves for what it holds: whole allocator segments.

torch's caching allocator serves requests of at most 1 MiB from 2 MiB segments and larger
ones from 20 MiB segments (a request of 10 MiB or more gets a segment of its own, rounded to
2 MiB), the two kinds apart: a freed small block never serves a large request, nor the
other way round. A private pool never borrows another's, and each slot of a graphed stage
captures into a pool of its own (pipecast.runtime.graphs). So a slot reserves its small
tensors at their fullest in 2 MiB segments and its large ones at theirs in 20 MiB segments:
VGG-16/CIFAR-10 over 2 x H100 at micro-batch 8 (h100x2-graph-memory-3), the first stage's
slots 28 MiB each (one large segment for its convolutions' weight gradients, four small for
activations of at most 1 MiB), the second's 22 (its 4.5 MiB gradients in one large segment).
"""

from __future__ import annotations

import math

SMALL_REQUEST = 2**20
"""The largest request the allocator serves from small segments."""
SMALL_SEGMENT = 2 * 2**20
LARGE_SEGMENT = 20 * 2**20


def slot_reserved(small: float, large: float = 0.0) -> int:
    """Bytes a private pool reserves to hold, at their fullest, `small` bytes in requests of
    at most SMALL_REQUEST and `large` bytes in bigger ones: small segments for the first
    (at least one: a capture always makes some small request), large ones for the second."""
    if small <= 0 and large <= 0:
        return 0
    smalls = max(1, math.ceil(small / SMALL_SEGMENT)) * SMALL_SEGMENT
    return smalls + math.ceil(max(large, 0.0) / LARGE_SEGMENT) * LARGE_SEGMENT
