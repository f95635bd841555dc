"""The list scheduler finds the next event from a heap of end times (issue 67: scanning every
action's end at each wait made a zero-bubble search over 10,000 actions take minutes); its
plans are the scan's, action for action."""

from __future__ import annotations

import random

import pytest

from pipecast.planning.schedules.greedy import _ORDER, Durations, list_schedule
from pipecast.values.plan.action import Action, B, F, Plan, W


def reference_schedule(
    name: str,
    placement: tuple[int, ...],
    microbatches: int,
    *,
    rank_limit: int,
    durations: Durations | None = None,
) -> Plan:
    stages, m = len(placement), microbatches
    ranks = max(placement) + 1
    times = durations or Durations.units(stages)
    own = [[s for s in range(stages) if placement[s] == r] for r in range(ranks)]
    counts = {"F": [0] * stages, "B": [0] * stages, "W": [0] * stages}
    end: dict[Action, float] = {}
    free = [0.0] * ranks
    rows: list[list[Action]] = [[] for _ in range(ranks)]
    remaining = 3 * stages * m

    def inputs(a: Action) -> list[Action]:
        if a.kind == "F":
            return [F(a.stage - 1, a.mb)] if a.stage else []
        if a.kind == "W":
            return [B(a.stage, a.mb)]
        return [F(a.stage, a.mb)] + ([B(a.stage + 1, a.mb)] if a.stage < stages - 1 else [])

    def arrives(d: Action, a: Action) -> float:
        crosses = placement[d.stage] != placement[a.stage]
        return end[d] + (times.transfer if crosses else 0.0)

    def candidates(r: int) -> list[tuple[float, Action]]:
        nf, nb, nw = counts["F"], counts["B"], counts["W"]
        in_flight = sum(nf[s] - nw[s] for s in own[r])
        acts = []
        for s in own[r]:
            if nb[s] < m:
                acts.append(B(s, nb[s]))
            if nf[s] < m and in_flight < rank_limit:
                acts.append(F(s, nf[s]))
            if nw[s] < nb[s]:
                acts.append(W(s, nw[s]))
        known = []
        for a in acts:
            deps = inputs(a)
            if all(d in end for d in deps):
                known.append((max((arrives(d, a) for d in deps), default=0.0), a))
        return known

    def priority(a: Action) -> tuple[int, int, int]:
        return _ORDER[a.kind], a.mb if a.kind == "W" else 0, -a.stage

    while remaining:
        active = [r for r in range(ranks) if any(counts["W"][s] < m for s in own[r])]
        now = min(free[r] for r in active)
        progressed, upcoming = False, []
        for r in active:
            if free[r] > now:
                continue
            known = candidates(r)
            ready = [a for t, a in known if t <= now + 1e-12]
            upcoming += [t for t, _ in known if t > now]
            if ready:
                a = min(ready, key=priority)
                end[a] = free[r] = now + times.of(a)
                rows[r].append(a)
                counts[a.kind][a.stage] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            later = [free[r] for r in active if free[r] > now] + upcoming
            later += [t for t in end.values() if t > now]
            if not later:
                raise RuntimeError(f"{name}: rank limit {rank_limit} leaves no action ready")
            for r in active:
                free[r] = max(free[r], min(later))
    return Plan(
        name=name,
        num_stages=stages,
        num_microbatches=m,
        stage_to_rank=placement,
        actions=tuple(tuple(r) for r in rows),
        split_backward=True,
    )


@pytest.mark.parametrize("seed", range(16))
def test_heap_schedule_is_the_scan_schedule(seed: int) -> None:
    rng = random.Random(seed)
    ranks = rng.choice([2, 3, 4, 6])
    virtual = rng.choice([1, 2])
    placement = tuple(
        (s if (s // ranks) % 2 == 0 else ranks - 1 - s % ranks) % ranks if virtual > 1 else s
        for s in range(ranks * virtual)
    )
    stages = len(placement)
    durations = (
        None
        if seed % 3 == 0
        else Durations(
            forward=tuple(rng.uniform(0.5, 2) for _ in range(stages)),
            backward_input=tuple(rng.uniform(0.5, 2) for _ in range(stages)),
            backward_weight=tuple(rng.choice([0.0, rng.uniform(0.2, 1.5)]) for _ in range(stages)),
            transfer=rng.choice([0.0, 0.3, 1.7]),
        )
    )
    m = rng.choice([1, 3, 8, 16])
    limit = rng.choice([ranks, 2 * ranks]) * virtual
    try:
        want = reference_schedule("zb-auto", placement, m, rank_limit=limit, durations=durations)
    except RuntimeError:  # a limit that leaves nothing ready: both say so
        with pytest.raises(RuntimeError, match="leaves no action ready"):
            list_schedule("zb-auto", placement, m, rank_limit=limit, durations=durations)
        return
    assert list_schedule("zb-auto", placement, m, rank_limit=limit, durations=durations) == want


@pytest.mark.parametrize("seed", range(12))
def test_the_ranks_queue_schedules_deep_uneven_pipelines_as_the_scan(seed: int) -> None:
    """The ranks due are taken from a queue by when each is free (issue 67: a scan of every
    rank at each event made a 128-rank head take seconds): on 8 to 16 ranks whose stages
    take unequal seconds, so that ranks fall due one at a time, and on equal units, where
    many fall due at once, the plan is the scan's."""
    rng = random.Random(100 + seed)
    ranks, m = rng.choice([8, 12, 16]), rng.choice([8, 20, 32])
    durations = (
        None
        if seed % 4 == 0
        else Durations(
            forward=tuple(rng.uniform(0.3, 3) for _ in range(ranks)),
            backward_input=tuple(rng.uniform(0.3, 3) for _ in range(ranks)),
            backward_weight=tuple(rng.choice([0.0, rng.uniform(0.1, 2)]) for _ in range(ranks)),
            transfer=rng.choice([0.0, 0.25, 1.1]),
        )
    )
    placement = tuple(range(ranks))
    limit = rng.choice([ranks, 2 * ranks])
    want = reference_schedule("zb-auto", placement, m, rank_limit=limit, durations=durations)
    assert list_schedule("zb-auto", placement, m, rank_limit=limit, durations=durations) == want
