"""How far a row's measurement moves, and whether that settles what the row is there to show.

A row's step time is the median of its timed steps; its spread is their interquartile range
over that median, the steps' run-to-run spread (rounds, where it was measured in several,
have their own: accuracy.Comparison.round_spread). Rows of one workload and batch on one
kind of device are there to be compared; a row whose spread is wider than the gap to the
nearest of them has not shown which of the two is faster.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.store import Row


def step_spread(times: Sequence[float]) -> float | None:
    """(third quartile - first quartile) / median of a row's timed steps (None: fewer than
    four, too few for quartiles to mean anything)."""
    if len(times) < 4:
        return None
    q1, mid, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return (q3 - q1) / mid if mid > 0 else None


@dataclass(frozen=True)
class Unsettled:
    """A row whose spread is wider than its gap to the nearest row it is compared with."""

    spread: float
    gap: float
    """|this step - the nearest's| / the faster of the two."""
    nearest: str
    """The nearest row's label."""


def _peers_key(row: Row) -> tuple[str, str, int, str]:
    cfg = BenchConfig.from_dict(row.config)
    return row.suite, cfg.workload.key, cfg.batch, str(row.environment.get("card", cfg.device))


def unsettled(rows: Sequence[Row]) -> dict[str, Unsettled]:
    """Row key -> why its measurement does not settle its order against the nearest row of
    the same suite, workload, batch and card (measured rows with a spread only; training
    runs for accuracy are not compared)."""
    timed: dict[tuple[str, str, int, str], list[tuple[Row, float]]] = {}
    for r in rows:
        m = r.measured or {}
        if r.status != "ok" or "step_time" not in m:
            continue
        if BenchConfig.from_dict(r.config).accuracy_steps:
            continue
        timed.setdefault(_peers_key(r), []).append((r, m["step_time"]))
    out: dict[str, Unsettled] = {}
    for peers in timed.values():
        for row, step in peers:
            spread = step_spread((row.measured or {}).get("step_times") or [])
            others = [(o, t) for o, t in peers if o.key != row.key]
            if spread is None or not others:
                continue
            other, near = min(others, key=lambda p: abs(p[1] - step))
            gap = abs(near - step) / min(near, step)
            if spread > gap:
                label = BenchConfig.from_dict(other.config).label()
                out[row.key] = Unsettled(spread, gap, label)
    return out
