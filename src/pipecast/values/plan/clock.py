"""A plan's unit clock: each action one time unit (a whole backward two), started as soon as
its rank is free and its inputs are done, with transfers free.

This is the order a plan promises before any costs are known; the runtime reads from it when
each send's receiver will need it (runtime/send_plan.py), so it needs no simulator.
"""

from __future__ import annotations

from pipecast.values.plan.action import Action, Plan
from pipecast.values.plan.validate import dependencies

UNITS = {"F": 1.0, "B": 1.0, "W": 1.0, "BW": 2.0}
"""Duration of each kind of action, in units: a whole backward is B then W."""


def unit_clock(plan: Plan) -> dict[Action, tuple[float, float]]:
    """(start, end) of every action of a valid plan on the unit clock."""
    times: dict[Action, tuple[float, float]] = {}
    heads = [0] * plan.num_ranks
    free = [0.0] * plan.num_ranks
    remaining = sum(len(actions) for actions in plan.actions)
    while remaining:
        for rank, actions in enumerate(plan.actions):
            while heads[rank] < len(actions):
                a = actions[heads[rank]]
                deps = dependencies(plan, a)
                if any(d not in times for d in deps):
                    break
                start = max([free[rank], *(times[d][1] for d in deps)])
                free[rank] = start + UNITS[a.kind]
                times[a] = (start, free[rank])
                heads[rank] += 1
                remaining -= 1
    return times
