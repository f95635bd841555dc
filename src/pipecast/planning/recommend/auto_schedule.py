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

from collections.abc import Iterator
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
    fitted = durations_of(costs)
    return [_first(ranks, microbatches)] + [
        _order(ranks, microbatches, durations, limit, 0)
        for durations, limit in _built(ranks, fitted)
    ]


def _built(ranks: int, fitted: Durations) -> list[tuple[Durations | None, int]]:
    """The list schedules among the candidates, in their order: (durations, None for equal
    units; micro-batches in flight)."""
    return [(durations, limit) for limit in (ranks, 2 * ranks) for durations in (fitted, None)]


@lru_cache(maxsize=16)
def _first(ranks: int, microbatches: int) -> Plan:
    return replace(zero_bubble_h1(ranks, microbatches), name="zb-auto")


@lru_cache(maxsize=64)
def _order(
    ranks: int, microbatches: int, durations: Durations | None, limit: int, until: int
) -> Plan:
    """One list schedule (its head up to rank 0's `until`-th action; 0: whole), kept for the
    next strategy with the same stages' seconds (its twins that differ only in how the
    optimizer's state is held: a list schedule over 128 ranks and as many micro-batches
    takes seconds) or, with equal units, the same ranks and micro-batches."""
    return zero_bubble_auto(ranks, microbatches, durations=durations, in_flight=limit, until=until)


def auto_plan(ranks: int, microbatches: int, costs: Costs, memory_limit: float = 0.0) -> Plan:
    """The fastest candidate under `costs` whose simulated peak memory stays within
    `memory_limit` bytes on every rank (0: no limit); the first candidate where none fits.

    A list schedule is built whole only where its head, up to rank 0's action after as
    many as it may keep in flight, may fit: least_peak_memory of a head (each rank's row a
    prefix of its whole row, every rank's fixed memory the same) over the limit means the
    whole plan's is (a rank's tally only rises with more actions), and its head is a small
    part of its price (a deep pipeline's list schedules cost seconds each, and most of them
    cannot fit where the limit binds)."""
    best: tuple[float, Plan] | None = None
    first = _first(ranks, microbatches)
    for plan in _orders(ranks, microbatches, costs, memory_limit):
        if memory_limit and least_peak_memory(plan, costs, memory_limit) > memory_limit:
            continue  # cannot fit: not worth a simulation
        timeline = simulate(plan, costs, exposed=False)
        if memory_limit and max(timeline.peak_memory) > memory_limit:
            continue
        if best is None or timeline.step_time < best[0] - 1e-12:
            best = (timeline.step_time, plan)
    return best[1] if best is not None else first


def _orders(ranks: int, microbatches: int, costs: Costs, memory_limit: float) -> Iterator[Plan]:
    """The candidates, but for the list schedules whose head cannot fit `memory_limit`."""
    yield _first(ranks, microbatches)
    for durations, limit in _built(ranks, durations_of(costs)):
        if memory_limit:
            head = _order(ranks, microbatches, durations, limit, limit + 1)
            if least_peak_memory(head, costs, memory_limit) > memory_limit:
                continue  # its head cannot fit: nor can it
        yield _order(ranks, microbatches, durations, limit, 0)
