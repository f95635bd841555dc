"""What the partitioner counts an interleaved stage holding (issue 67: any count of
virtual stages per rank)."""

from __future__ import annotations

import pytest

from pipecast.planning.partition.memory import in_flight
from pipecast.planning.schedules import make_plan

GRID = [(p, v, m) for p in (2, 3, 4) for v in (2, 3, 4) for m in (p, 2 * p, 3 * p)]


@pytest.mark.parametrize(("p", "v", "m"), [*GRID, (8, 4, 32), (4, 2, 16)])
def test_partition_memory_counts_what_a_stage_holds_at_its_peak(p: int, v: int, m: int) -> None:
    """The micro-batches the partitioner counts a stage holding (memory.in_flight) are the
    most any stage of the plan holds between its forward and its backward: no fewer (the
    stage would not fit), and no more (a split that fits would be refused)."""
    plan = make_plan("interleaved", p, m, virtual=v)
    most = 0
    for actions in plan.actions:
        held: dict[int, int] = {}
        for a in actions:
            held[a.stage] = held.get(a.stage, 0) + (1 if a.kind == "F" else -1)
            most = max(most, held[a.stage])
    assert {in_flight("interleaved", s, p * v, m, ranks=p) for s in range(p * v)} == {most}
