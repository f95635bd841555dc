"""Simulated against measured actions, rank by rank and kind by kind: where a miss comes from.

A measured action's time runs from the event before its first op to the one after its last,
on the device: where the host issued the action ahead of its data, that is the device's own
time; where the host was behind, the host's issuing. Beside it, the host seconds the rank
spent per action of that kind (the runtime's own bookkeeping and transfers included)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pipecast.values.timeline import Event

KINDS = ("F", "B", "W", "BW")


@dataclass(frozen=True, slots=True)
class ActionGap:
    rank: int
    kind: str
    count: int
    predicted: float
    """Mean simulated seconds of this rank's actions of this kind."""
    measured: float
    """Mean measured seconds of the same actions."""
    host: float | None
    """Measured host seconds per action of this kind (None: not recorded)."""

    @property
    def ratio(self) -> float | None:
        """measured / predicted (None: nothing was predicted for these actions)."""
        return self.measured / self.predicted if self.predicted > 0 else None


def action_gaps(
    predicted: Sequence[Event],
    measured: Sequence[Event],
    actions: Mapping[str, Sequence[float]] | None = None,
) -> list[ActionGap]:
    """Per rank and kind, over the actions both timelines hold (matched by name): mean
    simulated and measured seconds, and, from a measured row's `actions`, the host seconds
    per action (`host_<kind>` over `count_<kind>`, per rank)."""
    by_name = {(e.rank, e.name): e for e in measured if e.kind in KINDS}
    pairs: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for e in predicted:
        if e.kind in KINDS and (m := by_name.get((e.rank, e.name))) is not None:
            pairs.setdefault((e.rank, e.kind), []).append((e.duration, m.duration))
    gaps = []
    for (rank, kind), both in sorted(
        pairs.items(), key=lambda kv: (kv[0][0], KINDS.index(kv[0][1]))
    ):
        host = None
        if actions is not None:
            total, count = actions.get(f"host_{kind}", ()), actions.get(f"count_{kind}", ())
            if rank < len(total) and rank < len(count) and count[rank] > 0:
                host = total[rank] / count[rank]
        gaps.append(
            ActionGap(
                rank=rank,
                kind=kind,
                count=len(both),
                predicted=statistics.fmean(p for p, _ in both),
                measured=statistics.fmean(m for _, m in both),
                host=host,
            )
        )
    return gaps


def gap_rows(label: str, gaps: Sequence[ActionGap]) -> list[list[str]]:
    """Table rows (configuration, rank, action, count, predicted, measured, measured /
    predicted, host per action), times in ms."""
    return [
        [
            label,
            str(g.rank),
            g.kind,
            str(g.count),
            f"{g.predicted * 1e3:.3f}",
            f"{g.measured * 1e3:.3f}",
            "no time predicted" if g.ratio is None else f"{g.ratio:.2f}x",
            "" if g.host is None else f"{g.host * 1e3:.3f}",
        ]
        for g in gaps
    ]


GAP_HEADER = [
    "configuration",
    "rank",
    "action",
    "n",
    "predicted (ms)",
    "measured (ms)",
    "measured / predicted",
    "host per action (ms)",
]
