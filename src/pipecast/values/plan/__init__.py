"""A schedule as data: actions, the Plan, its validator, unit clock and grid printer."""

from pipecast.values.plan.action import Action, Kind, Plan
from pipecast.values.plan.clock import unit_clock
from pipecast.values.plan.grid import render_grid
from pipecast.values.plan.validate import dependencies, validate

__all__ = ["Action", "Kind", "Plan", "dependencies", "render_grid", "unit_clock", "validate"]
