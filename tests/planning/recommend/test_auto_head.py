"""ZB-auto builds a list schedule whole only where its head may fit (issue 67: a 405B plan
on 512 GPUs spent a quarter of its time building list schedules that could not fit).

A head (list_schedule's `until`) is the whole schedule cut where rank 0 starts its
`until`-th action, every rank's row a prefix of its whole row; least_peak_memory of a head
over a limit means the whole plan's is. The references: the whole schedule, and auto_plan
as simulating every whole candidate chooses."""

from __future__ import annotations

import random

import pytest

from pipecast.planning.recommend.auto_schedule import _orders, auto_plan, candidates, durations_of
from pipecast.planning.schedules.greedy import Durations, list_schedule
from pipecast.planning.simulation import Costs, StageTimes, simulate
from pipecast.planning.simulation.memory import least_peak_memory


@pytest.mark.parametrize("seed", range(12))
def test_a_head_is_a_prefix_of_every_rank_s_row(seed: int) -> None:
    rng = random.Random(seed)
    ranks, m = rng.choice([2, 3, 4, 6]), rng.choice([2, 5, 8, 12])
    durations = Durations(
        forward=tuple(rng.uniform(0.5, 2) for _ in range(ranks)),
        backward_input=tuple(rng.uniform(0.5, 2) for _ in range(ranks)),
        backward_weight=tuple(rng.uniform(0.2, 1.5) for _ in range(ranks)),
        transfer=rng.choice([0.0, 0.4]),
    )
    placement = tuple(range(ranks))
    limit = rng.choice([ranks, 2 * ranks])
    whole = list_schedule("zb-auto", placement, m, rank_limit=limit, durations=durations)
    for until in (1, limit, limit + 1, 2 * limit + 3, 3 * m + 5):
        head = list_schedule(
            "zb-auto", placement, m, rank_limit=limit, durations=durations, until=until
        )
        assert len(head.actions[0]) == min(until, 3 * m)
        for part, row in zip(head.actions, whole.actions, strict=True):
            assert row[: len(part)] == part
    assert sum(map(len, head.actions)) == 3 * ranks * m  # past rank 0's last: the whole


def _costs(rng: random.Random, ranks: int) -> Costs:
    stages = []
    for s in range(ranks):
        moved = rng.choice([0, 10, 30])
        stages.append(
            StageTimes(
                forward=rng.uniform(0.2, 3),
                backward_input=rng.uniform(0.2, 3),
                backward_weight=rng.uniform(0.1, 2),
                backward=3.0,
                activation_bytes=rng.choice([100, 250, 400, 1000]),
                input_bytes=moved if s else 0,
                output_bytes=moved if s < ranks - 1 else 0,
                held_bytes=rng.choice([0, 20]),
                workspace_bytes=rng.choice([0, 15]),
                param_bytes=rng.choice([50, 200]),
            )
        )
    links = tuple(rng.uniform(0.0, 1.0) for _ in range(ranks - 1))
    return Costs(stages=tuple(stages), forward_transfer=links, backward_transfer=links)


@pytest.mark.parametrize("seed", range(64))
def test_auto_plan_picks_what_simulating_every_whole_candidate_picks(seed: int) -> None:
    """Under every limit at and around each candidate's bound, its head's bound and its
    simulated peak: the fastest candidate whose simulated peak fits, the first at equal
    steps, the first candidate where none fits; and some limits screen a head out."""
    rng = random.Random(seed)
    ranks, m = rng.choice([2, 3, 4]), rng.choice([4, 8, 12])
    costs = _costs(rng, ranks)
    plans = candidates(ranks, m, costs)
    timed = [simulate(p, costs, exposed=False) for p in plans]
    least = [least_peak_memory(p, costs) for p in plans]
    heads = [
        least_peak_memory(
            list_schedule(
                "zb-auto", tuple(range(ranks)), m, rank_limit=limit, durations=durations,
                until=limit + 1,
            ),
            costs,
        )
        for limit in (ranks, 2 * ranks)
        for durations in (durations_of(costs), None)
    ]  # fmt: skip

    def fastest(limit: int) -> int:
        best: int | None = None
        for i, t in enumerate(timed):
            if max(t.peak_memory) <= limit and (
                best is None or t.step_time < timed[best].step_time - 1e-12
            ):
                best = i
        return 0 if best is None else best

    marks = {n for t in timed for n in t.peak_memory} | set(least) | set(heads)
    screened = 0
    for limit in sorted({n + d for n in marks for d in (-1, 0, 1) if n + d > 0}):
        assert auto_plan(ranks, m, costs, memory_limit=limit) == plans[fastest(limit)], limit
        kept = list(_orders(ranks, m, costs, limit))
        left = [i for i, p in enumerate(plans) if not any(p is k for k in kept)]
        assert all(least[i] > limit for i in left), (limit, left)
        screened += len(left)
    assert screened > 0
