"""How much one simulated step may hold, checked before it is simulated.

The simulator replays every action of a step, and the Gantt chart draws each one: the time
grows with their count, faster than linearly where a rank's host runs ahead of its device
and transfers pile up. A step of 100,000 micro-batches printed nothing for five minutes; its
time per sample had settled thousands of micro-batches before.
"""

from __future__ import annotations

from pipecast.errors import ConfigError
from pipecast.planning.schedules.generators import stages_per_rank

MAX_ACTIONS = 2**14
"""The most compute actions (F, B, W or BW of one stage and micro-batch) a simulated step
may hold: 1F1B over 2 ranks and 4,096 micro-batches, or over 16 ranks and 512, reaches it."""

SPLIT_BACKWARD = ("zb-h1", "zb-v", "zb-auto")
"""Schedules whose backward is two actions, B and W."""


def compute_actions(schedule: str, stages: int, microbatches: int, virtual: int = 0) -> int:
    """The F, B, W and BW actions of one step of `schedule` over `stages` pipeline ranks
    (each holding its `virtual` stages, stages_per_rank) and `microbatches`."""
    kinds = 1 if schedule == "forward-only" else 3 if schedule in SPLIT_BACKWARD else 2
    return stages * stages_per_rank(schedule, virtual) * microbatches * kinds


def check_simulable(schedule: str, stages: int, microbatches: int, virtual: int = 0) -> None:
    """A one-line ConfigError where a step holds more than MAX_ACTIONS compute actions."""
    actions = compute_actions(schedule, stages, microbatches, virtual)
    if actions > MAX_ACTIONS:
        most = MAX_ACTIONS * microbatches // actions
        raise ConfigError(
            f"a {schedule} step over {stages} pipeline rank(s) and {microbatches:,} "
            f"micro-batches holds {actions:,} compute actions, more than the "
            f"{MAX_ACTIONS:,} pipecast simulates: use at most {most:,} micro-batches (a "
            "step's time per sample settles long before) or fewer stages"
        )
