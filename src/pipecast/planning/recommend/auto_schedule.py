"""ZB-auto's order: a small search over zero-bubble orders, each simulated on the strategy's
own costs, keeping the fastest that fits the device's memory.

The list scheduler (schedules/greedy.py) is a heuristic: built from the stages' real F, B, W
and transfer seconds it usually fills the gaps those leave, but not always better than the
same scheduler run on equal units, and more micro-batches in flight buy speed with memory.
So the candidates are the list schedule from the costs and from equal units, each with S and
with 2S micro-batches in flight, and ZB-H1's order; the simulator, which prices every one of
them the same way, decides.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from pipecast.planning.schedules.generators import zero_bubble_auto, zero_bubble_h1
from pipecast.planning.schedules.greedy import Durations
from pipecast.planning.simulation.costs import Costs
from pipecast.planning.simulation.memory import least_peak_memory
from pipecast.planning.simulation.simulator import simulate
from pipecast.values.plan.action import Plan


def durations_of(costs: Costs) -> Durations:
    """Each stage's F, B and W seconds, and the mean seconds of a transfer between stages,
    for a schedule built from costs."""
    moves = [*costs.forward_transfer, *costs.backward_transfer]
    return Durations(
        forward=tuple(st.forward for st in costs.stages),
        backward_input=tuple(st.backward_input for st in costs.stages),
        backward_weight=tuple(st.backward_weight for st in costs.stages),
        transfer=sum(moves) / len(moves) if moves else 0.0,
    )


def candidates(ranks: int, microbatches: int, costs: Costs) -> list[Plan]:
    """The orders ZB-auto chooses among, fewest micro-batches in flight first."""
    return list(_orders(ranks, microbatches, durations_of(costs)))


@lru_cache(maxsize=16)
def _orders(ranks: int, microbatches: int, fitted: Durations) -> tuple[Plan, ...]:
    """candidates' orders, kept for the next strategy with the same stages' seconds (its
    twins that differ only in how the optimizer's state is held: a list schedule over 128
    ranks and as many micro-batches takes seconds)."""
    plans = [replace(zero_bubble_h1(ranks, microbatches), name="zb-auto")]
    for limit in (ranks, 2 * ranks):
        for durations in (fitted, None):
            plans.append(
                zero_bubble_auto(ranks, microbatches, durations=durations, in_flight=limit)
            )
    return tuple(plans)


def auto_plan(ranks: int, microbatches: int, costs: Costs, memory_limit: float = 0.0) -> Plan:
    """The fastest candidate under `costs` whose simulated peak memory stays within
    `memory_limit` bytes on every rank (0: no limit); the first candidate where none fits."""
    best: tuple[float, Plan] | None = None
    plans = candidates(ranks, microbatches, costs)
    for plan in plans:
        if memory_limit and least_peak_memory(plan, costs, memory_limit) > memory_limit:
            continue  # cannot fit: not worth a simulation
        timeline = simulate(plan, costs, exposed=False)
        if memory_limit and max(timeline.peak_memory) > memory_limit:
            continue
        if best is None or timeline.step_time < best[0] - 1e-12:
            best = (timeline.step_time, plan)
    return best[1] if best is not None else plans[0]
