"""Which pipeline depths and virtual-stage counts a recommendation considers.

Depths: the powers of two that divide the data and pipeline ranks, and the ranks
themselves, as before; and every other divisor of the ranks that the model's blocks divide
(3 or 6 pipeline ranks of a 12-block model): Megatron asks the layers to share out evenly
over a pipeline's stages, and a depth the layers do not divide leaves a stage a block more
than the rest, which a power of two near it does as well.

Virtual stages: the interleaved schedule runs 2 to MAX_VIRTUAL stages per rank, as many as
leave every stage a block (Megatron's interleaving shrinks the bubble by the count, for a
transfer per stage more); ZB-V its 2; the rest 1.
"""

from __future__ import annotations

from pipecast.planning.schedules.generators import STAGES_PER_RANK

MAX_VIRTUAL = 4
"""The most virtual stages per rank an interleaved pipeline is offered with."""


def pipeline_depths(ranks: int, blocks: int) -> list[int]:
    """The pipeline depths (ranks per pipeline, from 2) for `ranks` data and pipeline ranks
    of a model of `blocks` blocks, in rising order."""
    powers = {d for d in _powers_of_two(ranks) if ranks % d == 0} | {ranks}
    even = {d for d in range(3, ranks) if ranks % d == 0 and blocks % d == 0}
    return sorted(d for d in powers | even if d >= 2)


def virtual_counts(schedule: str, depth: int, blocks: int) -> list[int]:
    """The virtual stages per rank `schedule` is offered with on `depth` pipeline ranks:
    those that leave each of the depth x count stages a block (none where no count does)."""
    if schedule == "interleaved":
        counts = range(2, MAX_VIRTUAL + 1)
    else:
        counts = range(STAGES_PER_RANK.get(schedule, 1), STAGES_PER_RANK.get(schedule, 1) + 1)
    return [v for v in counts if depth * v <= blocks]


def _powers_of_two(n: int) -> list[int]:
    out, d = [], 1
    while d <= n:
        out.append(d)
        d *= 2
    return out
