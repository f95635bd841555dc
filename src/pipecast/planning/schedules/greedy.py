"""A list scheduler in continuous time, used to build the automatic zero-bubble schedule.

Whenever a rank is free it starts, among the actions whose inputs have arrived, a B first
(it unblocks the previous stage; later stage first), else the next F if the rank keeps fewer
than `rank_limit` micro-batches in flight (F done, W not yet), else the oldest pending W. If
nothing is ready it waits for the next event. Each stage's F, B and W take the seconds the
caller gives (equal units by default), and an input that crosses ranks arrives `transfer`
seconds after its producer ends, so the order fits the durations it was built from.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from pipecast.values.plan.action import Action, B, F, Plan, W

_ORDER = {"B": 0, "F": 1, "W": 2}


@dataclass(frozen=True)
class Durations:
    """Seconds of each stage's F, B and W, and of a transfer between ranks (both ways)."""

    forward: Sequence[float]
    backward_input: Sequence[float]
    backward_weight: Sequence[float]
    transfer: float = 0.0

    @classmethod
    def units(cls, stages: int) -> Durations:
        return cls((1.0,) * stages, (1.0,) * stages, (1.0,) * stages)

    def of(self, a: Action) -> float:
        seconds = {"F": self.forward, "B": self.backward_input, "W": self.backward_weight}
        return seconds[a.kind][a.stage]


def list_schedule(
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
    ends: list[float] = []  # end times not yet passed, least first (a heap)

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
                heapq.heappush(ends, end[a])
                rows[r].append(a)
                counts[a.kind][a.stage] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            later = [free[r] for r in active if free[r] > now] + upcoming
            # the next end after now: `now` never goes back, so an end passed stays passed
            # (scanning every end here made a step of 10,000 actions take minutes)
            while ends and ends[0] <= now:
                heapq.heappop(ends)
            later += ends[:1]
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
