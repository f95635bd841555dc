"""The per-rank grid: a plan printed as rows of actions, with chosen actions marked.

    rank 0 | 0F0  0F1  0F2  0F3 [0BW0] 0F4 ...

The validator and the runtime's timeout report both print it.
"""

from __future__ import annotations

from pipecast.values.plan.action import Action, Plan


def render_grid(plan: Plan, marks: dict[int, Action] | None = None, width: int = 5) -> str:
    """One row per rank; the action marked for a rank is shown in [brackets]."""
    marks = marks or {}
    lines = []
    for rank, actions in enumerate(plan.actions):
        cells = []
        for a in actions:
            text = str(a)
            cells.append(f"[{text}]" if marks.get(rank) == a else f" {text} ")
        lines.append(f"rank {rank} |" + "".join(c.ljust(width + 2) for c in cells).rstrip())
    return "\n".join(lines)
