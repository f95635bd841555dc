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
    until: int = 0,
) -> Plan:
    """The list schedule of `microbatches` micro-batches over stages placed by `placement`.
    `until`: stop once rank 0 has that many actions (0: schedule them all); the Plan is then
    a head of the whole one, each rank's row a prefix of its whole row (what the ranks had
    started when rank 0 started its `until`-th action), and is not a valid plan."""
    stages, m = len(placement), microbatches
    ranks = max(placement) + 1
    times = durations or Durations.units(stages)
    seconds = {"F": times.forward, "B": times.backward_input, "W": times.backward_weight}
    transfer = times.transfer
    own = [[s for s in range(stages) if placement[s] == r] for r in range(ranks)]
    nf, nb, nw = [0] * stages, [0] * stages, [0] * stages
    # end times by stage and micro-batch (None: not yet scheduled); plain lists, not a dict
    # of Actions: a search over 50,000 actions spent most of its time hashing them
    end_f: list[list[float | None]] = [[None] * m for _ in range(stages)]
    end_b: list[list[float | None]] = [[None] * m for _ in range(stages)]
    # what crossing from stage s to its neighbour adds to an input's arrival
    up = [transfer if s and placement[s - 1] != placement[s] else 0.0 for s in range(stages)]
    down = [
        transfer if s < stages - 1 and placement[s + 1] != placement[s] else 0.0
        for s in range(stages)
    ]
    free = [0.0] * ranks
    rows: list[list[Action]] = [[] for _ in range(ranks)]
    remaining = 3 * stages * m
    ends: list[float] = []  # end times not yet passed, least first (a heap)
    weights_left = [len(own[r]) * m for r in range(ranks)]
    # the ranks with work left by when each is free, least first (a heap, each rank once:
    # only the ranks due now change their `free`; taking the least from a scan over every
    # rank at each event made a 128-rank search's heads take seconds)
    queue = [(0.0, r) for r in range(ranks) if weights_left[r] > 0]
    # a rank's candidates change only when it or a rank whose outputs it takes starts one
    # (its own counts, or an input's end time): kept until then, they are the same list
    known_of: list[list[tuple[float, str, int]] | None] = [None] * ranks
    waiting = [
        sorted({placement[t] for s in own[r] for t in (s - 1, s + 1) if 0 <= t < stages} - {r})
        for r in range(ranks)
    ]

    def candidates(r: int) -> list[tuple[float, str, int]]:
        """(when its inputs arrive, kind, stage) of each action rank `r` may start next
        whose inputs exist, in the order B, F, W of each of its stages."""
        in_flight = sum(nf[s] - nw[s] for s in own[r])
        known = []
        for s in own[r]:
            i = nb[s]
            if i < m:
                f = end_f[s][i]
                b = end_b[s + 1][i] if s < stages - 1 else 0.0
                if f is not None and b is not None:
                    known.append((max(f, b + down[s]) if s < stages - 1 else f, "B", s))
            i = nf[s]
            if i < m and in_flight < rank_limit:
                if not s:
                    known.append((0.0, "F", s))
                elif (f := end_f[s - 1][i]) is not None:
                    known.append((f + up[s], "F", s))
            i = nw[s]
            if i < nb[s]:
                b = end_b[s][i]
                assert b is not None
                known.append((b, "W", s))
        return known

    while remaining:
        now = queue[0][0]
        due = []  # in rank order, as ties pop
        while queue and queue[0][0] <= now:
            due.append(heapq.heappop(queue)[1])
        progressed, upcoming = False, []
        # each rank sets only its own `free`: the ranks due now are known before the first
        for r in due:
            known = known_of[r]
            if known is None:
                known = known_of[r] = candidates(r)
            ready = [(kind, s) for t, kind, s in known if t <= now + 1e-12]
            upcoming += [t for t, _, _ in known if t > now]
            if ready:
                kind, s = min(ready, key=lambda ks: _priority(ks, nw))
                done = free[r] = now + seconds[kind][s]
                heapq.heappush(ends, done)
                if kind == "F":
                    end_f[s][nf[s]] = done
                    rows[r].append(F(s, nf[s]))
                    nf[s] += 1
                elif kind == "B":
                    end_b[s][nb[s]] = done
                    rows[r].append(B(s, nb[s]))
                    nb[s] += 1
                else:
                    rows[r].append(W(s, nw[s]))
                    nw[s] += 1
                    weights_left[r] -= 1
                remaining -= 1
                progressed = True
                known_of[r] = None
                for q in waiting[r]:
                    known_of[q] = None
                if until and not r and len(rows[0]) >= until:
                    remaining = 0  # the head asked for: the rows so far
                    break
        if not progressed:
            later = [t for t, _ in queue[:1]] + upcoming  # the next rank free, after now
            # the next end after now: `now` never goes back, so an end passed stays passed
            # (scanning every end here made a step of 10,000 actions take minutes)
            while ends and ends[0] <= now:
                heapq.heappop(ends)
            later += ends[:1]
            if not later:
                raise RuntimeError(f"{name}: rank limit {rank_limit} leaves no action ready")
            nxt = min(later)
            for r in due:  # the others are free no earlier
                free[r] = max(free[r], nxt)
        for r in due:
            if weights_left[r] > 0:  # a rank that ran its last W is done
                heapq.heappush(queue, (free[r], r))
    return Plan(
        name=name,
        num_stages=stages,
        num_microbatches=m,
        stage_to_rank=placement,
        actions=tuple(tuple(r) for r in rows),
        split_backward=True,
    )


def _priority(ks: tuple[str, int], nw: list[int]) -> tuple[int, int, int]:
    """B first (the later stage first), then F, then the oldest W."""
    kind, s = ks
    return _ORDER[kind], nw[s] if kind == "W" else 0, -s
