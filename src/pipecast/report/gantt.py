"""Gantt chart of a Timeline: ranks by time, F/B/W coloured, micro-batch numbers on bars."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.patches import Patch

from pipecast.report.figure_file import save_figure
from pipecast.values.timeline import Event, Timeline

COLOURS = {
    "F": "#4C72B0",
    "B": "#DD8452",
    "W": "#55A868",
    "BW": "#C44E52",
    "send": "#B0B0B0",
    "allreduce": "#8172B3",
    "optimizer": "#937860",
}


def gantt(timeline: Timeline, path: str, *, title: str = "") -> None:
    fig, ax = plt.subplots(figsize=(12, 0.6 * timeline.num_ranks + 1.6))
    scale, unit = _unit(timeline.step_time)
    _draw(ax, timeline.events, timeline.num_ranks, scale, unit)
    ax.set_title(
        title
        or f"{timeline.plan}: step {timeline.step_time * scale:.2f} {unit}, "
        f"bubble {timeline.bubble_fraction:.1%}"
    )
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def _unit(seconds: float) -> tuple[float, str]:
    return (1e3, "ms") if seconds < 10 else (1.0, "s")


def _draw(ax: Axes, events: Sequence[Event], ranks: int, scale: float, unit: str) -> None:
    """Ranks by time on `ax`: compute bars, thinner transfer bars, micro-batch numbers on
    the bars wide enough to hold them, a legend of the kinds shown."""
    span = max((e.end for e in events), default=0.0)
    comm = [e.kind in ("send", "allreduce") for e in events]
    # one collection per rank and kind: a patch per bar takes minutes for a long step
    bars: dict[tuple[float, float, str], list[tuple[float, float]]] = defaultdict(list)
    for e, c in zip(events, comm, strict=True):
        height = 0.22 if c else 0.6
        y = e.rank + (0.32 if c else 0.0)
        bars[(y - height / 2, height, e.kind)].append((e.start * scale, e.duration * scale))
    for (low, height, kind), spans in bars.items():
        ax.broken_barh(
            spans,
            (low, height),
            facecolors=COLOURS.get(kind, "#999999"),
            edgecolor="white",
            linewidth=0.4,
        )
    for e, c in zip(events, comm, strict=True):
        if e.mb >= 0 and not c and e.duration > span / 120:
            ax.text(
                (e.start + e.duration / 2) * scale,
                e.rank,
                str(e.mb),
                ha="center",
                va="center",
                fontsize=6,
                color="white",
            )
    ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    kinds = sorted(
        {e.kind for e in events},
        key=lambda k: list(COLOURS).index(k) if k in COLOURS else len(COLOURS),
    )
    ax.legend(
        handles=[Patch(color=COLOURS.get(k, "#999999"), label=k) for k in kinds],
        loc="upper right",
        fontsize=7,
        ncol=max(len(kinds), 1),
    )


def gantt_pair(
    predicted: Sequence[Event], measured: Sequence[Event], path: str, *, title: str
) -> None:
    """The simulated step above the measured one, on one time axis: where they part is
    where a prediction missed (each rank's measured times run from its own step start)."""
    gantt_stack([("predicted", predicted), ("measured", measured)], path, title=title)


def gantt_stack(runs: Sequence[tuple[str, Sequence[Event]]], path: str, *, title: str) -> None:
    """Each labelled run's ranks by time, one above the other on one time axis (one run:
    one chart)."""
    every = [e for _, events in runs for e in events]
    ranks = max((e.rank for e in every), default=0) + 1
    scale, unit = _unit(max((e.end for e in every), default=0.0))
    fig, axes = plt.subplots(
        len(runs), 1, figsize=(12, len(runs) * (0.6 * ranks + 1.3)), sharex=True, squeeze=False
    )
    for ax, (what, events) in zip(axes[:, 0], runs, strict=True):
        _draw(ax, events, ranks, scale, unit)
        end = max((e.end for e in events), default=0.0)
        ax.set_title(f"{what}: last action ends at {end * scale:.2f} {unit}", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
