"""A sharded data-parallel step (FSDP) simulated on unit costs, checked against timelines and
memory worked out by hand from the rules in planning/simulation/sharded.py."""

from __future__ import annotations

import pytest

from pipecast.planning.simulation.sharded import ShardedStep, Unit, sharded_step


def _units(gather: float, scatter: float) -> list[Unit]:
    unit = Unit(
        forward=1.0,
        backward=2.0,
        gather=gather,
        scatter=scatter,
        optimizer=0.1,
        param_bytes=100,
        activation_bytes=10,
    )
    return [unit] * 3


def test_gathers_hide_behind_the_compute_but_the_first() -> None:
    """Gathers of 0.5 under forwards of 1: only the first gather (0.5) and the last
    reduce-scatter (0.5) are exposed: 0.5 + 3 x 1 + 3 x 2 + 0.5 + optimizer 0.3 = 10.3,
    whether the units are gathered again for the backward or kept."""
    for reshard in ("full", "grad"):
        t = sharded_step(_units(0.5, 0.5), ShardedStep(replicas=2, reshard=reshard))  # type: ignore[arg-type]
        assert t.step_time == pytest.approx(10.3)
        assert t.exposed_comm == pytest.approx(1.0)


def test_a_slow_channel_sets_the_pace() -> None:
    """Gathers and reduce-scatters of 2 against forwards of 1 and backwards of 2, by hand:
    forward g0 [0,2] F0 [2,3] g1 [2,4] F1 [4,5] g2 [4,6] F2 [6,7]; backward, gathering
    again: BW2 [7,9] with g1 [7,9] beside it, s2 [9,11], BW1 [9,11], g0 [11,13], s1
    [13,15], BW0 [13,15], s0 [15,17], optimizer to 17.3. Kept gathered: BW2 [7,9], s2
    [9,11], BW1 [9,11], s1 [11,13], BW0 [11,13], s0 [13,15]: 15.3."""
    full = sharded_step(_units(2.0, 2.0), ShardedStep(replicas=2, reshard="full"))
    assert full.step_time == pytest.approx(17.3)
    backward = {e.name: (e.start, e.end) for e in full.events if e.kind == "BW"}
    assert backward == {"BW u2": (7, 9), "BW u1": (9, 11), "BW u0": (13, 15)}
    kept = sharded_step(_units(2.0, 2.0), ShardedStep(replicas=2, reshard="grad"))
    assert kept.step_time == pytest.approx(15.3)
    assert not any(e.kind == "allgather" and e.start >= 7 for e in kept.events)


def test_memory_is_the_shards_and_what_is_gathered_at_the_peak() -> None:
    """Three units of 100 weight bytes and 10 activation bytes over 2 replicas, no optimizer
    state: shards 300/2 x (weights + gradients) = 300. Resharded, the peak is the last
    unit's backward start: 30 activations + units 2 and 1 gathered (200) + unit 2's gradient
    and its reduce-scatter input (200) = 430. Kept gathered, all three units are (300):
    530."""
    full = sharded_step(_units(0.5, 0.5), ShardedStep(replicas=2, reshard="full"))
    assert full.peak_memory == (730, 730)
    kept = sharded_step(_units(0.5, 0.5), ShardedStep(replicas=2, reshard="grad"))
    assert kept.peak_memory == (830, 830)
    state = sharded_step(_units(0.5, 0.5), ShardedStep(replicas=4, reshard="full", state_bytes=2.0))
    assert state.peak_memory[0] == 300 // 4 * 4 + 430  # (weights, gradients, 2 x state) / 4
