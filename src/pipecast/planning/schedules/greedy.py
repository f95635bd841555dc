"""A list scheduler in continuous time, used to build the zero-bubble V schedule.

Whenever a rank is free it starts, among the actions whose inputs have arrived, a B first
(it unblocks the previous stage; later stage first), else the next F if the rank keeps fewer
than `rank_limit` micro-batches in flight (F done, W not yet), else the oldest pending W. If
nothing is ready it waits for the next event. Durations are relative (F, B, W), default equal.
"""

from __future__ import annotations

from pipecast.values.plan.action import Action, B, F, Plan, W

_ORDER = {"B": 0, "F": 1, "W": 2}


def list_schedule(
    name: str,
    placement: tuple[int, ...],
    microbatches: int,
    *,
    rank_limit: int,
    durations: tuple[float, float, float] = (1.0, 1.0, 1.0),
) -> Plan:
    stages, m = len(placement), microbatches
    ranks = max(placement) + 1
    own = [[s for s in range(stages) if placement[s] == r] for r in range(ranks)]
    counts = {"F": [0] * stages, "B": [0] * stages, "W": [0] * stages}
    end: dict[Action, float] = {}
    free = [0.0] * ranks
    rows: list[list[Action]] = [[] for _ in range(ranks)]
    remaining = 3 * stages * m
    duration = dict(zip("FBW", durations, strict=True))

    def inputs(a: Action) -> list[Action]:
        if a.kind == "F":
            return [F(a.stage - 1, a.mb)] if a.stage else []
        if a.kind == "W":
            return [B(a.stage, a.mb)]
        return [F(a.stage, a.mb)] + ([B(a.stage + 1, a.mb)] if a.stage < stages - 1 else [])

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
                known.append((max((end[d] for d in deps), default=0.0), a))
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
                end[a] = free[r] = now + duration[a.kind]
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
