"""How a stage's blocks are grouped into separate autograd graphs for the split backward.

W re-enters the autograd graph once per node that feeds weights (runtime/backward.py), and
each such call walks every node reachable below its entry point before it runs anything.
Over one graph for a whole stage that walk grows with the square of the stage's depth: W
of a deep stage costs the host about twice what its layers' W timed one at a time add up to
(docs/decisions.md, "A split backward cut into segments"). Cut into segments, each its own
graph, the walk stays inside a segment; each cut costs B one more autograd call. A segment
closes once its blocks hold SEGMENT_PARAMS parameter tensors: one transformer layer (12
tensors) or ResNet bottleneck (9) per segment, four VGG convolutions (2 each) per segment.

The runtime cuts its stages this way and the profile prices a stage's B calls the same way,
so this rule is the one place both read.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

SEGMENT_PARAMS = 8


def segments(param_tensors: Sequence[int], limit: int = SEGMENT_PARAMS) -> list[tuple[int, int]]:
    """Contiguous (start, stop) ranges covering the blocks whose parameter tensor counts are
    `param_tensors`: a range closes after the block that brings it to `limit` tensors, and
    blocks after the last closed range, too few tensors for a range of their own, join it.
    At least one range, even for no weights at all."""
    if limit < 1:
        raise ValueError(f"a segment needs a limit of at least 1 tensor, got {limit}")
    bounds = [0]
    held = 0
    for index, count in enumerate(param_tensors):
        held += count
        if held >= limit:
            bounds.append(index + 1)
            held = 0
    n = len(param_tensors)
    if len(bounds) == 1:
        bounds.append(n)
    bounds[-1] = n
    return list(itertools.pairwise(bounds)) or [(0, 0)]
