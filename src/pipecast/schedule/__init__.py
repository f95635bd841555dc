"""Schedules as data: actions, plans, generators, the validator and the grid printer."""

from pipecast.schedule.action import Action, Kind, Plan
from pipecast.schedule.generators import SCHEDULES, make_plan, stages_per_rank
from pipecast.schedule.grid import render_grid
from pipecast.schedule.validate import dependencies, validate

__all__ = [
    "SCHEDULES",
    "Action",
    "Kind",
    "Plan",
    "dependencies",
    "make_plan",
    "render_grid",
    "stages_per_rank",
    "validate",
]
