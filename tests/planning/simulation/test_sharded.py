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


def test_a_sharded_pipeline_stage_holds_whole_weights_beside_its_shards() -> None:
    """A pipeline stage FSDP shards over 4 replicas, kept gathered through the step: its
    whole weights and gradients (2 x 1000) beside their shards and Adam's two moments
    ((2 + 2) x 1000 / 4): 3000; the step's square roots on its shard (1000 / 4) come after
    the activations (400) are gone, so the peak is 3000 + 400."""
    from pipecast.planning.schedules import make_plan
    from pipecast.planning.simulation import Costs, StageTimes, simulate

    st = StageTimes(
        forward=1, backward_input=1, backward_weight=1, backward=2, param_bytes=1000,
        activation_bytes=400,
    )  # fmt: skip
    costs = Costs(stages=(st,), optimizer="adam", shards=(4,), allreduce=(0.5,), lead=(0.25,))
    t = simulate(make_plan("1f1b", 1, 1), costs, exposed=False)
    assert t.peak_memory == (3400,)
    # the stage starts once its first unit is gathered: F [0.25, 1.25], BW to 3.25, then the
    # reduce-scatter (all of it after the backward it follows, there being one bucket)
    assert t.step_time == pytest.approx(3.75)


def test_tensor_parallelism_adds_two_all_reduces_a_pass_per_split_block() -> None:
    """Two blocks, one split over 2 ranks (its weights halve in the rank's profile), the
    other whole: the split one adds 2 all-reduces of its 1000-byte output to each stage's
    forward and backward, the whole one none."""
    from dataclasses import replace

    from tests.planning.partition.test_partition import make_profile

    from pipecast.planning.recommend.mesh import tp_collectives
    from pipecast.values.hardware.presets import describe

    profile = make_profile([1e-3] * 2, params=[4000, 4000])
    halved = replace(profile.blocks[0], param_bytes=2000)
    profile = replace(profile, tensor_parallel={2: (halved, profile.blocks[1])})
    cluster = describe(gpus_per_node=2, memory="80GiB")
    one = cluster.allreduce_time(1000, range(2))
    assert tp_collectives(profile, 0, 2, 8, cluster, 2) == pytest.approx(2 * one)
    assert tp_collectives(profile, 1, 2, 8, cluster, 2) == 0.0
    assert tp_collectives(profile, 0, 2, 8, cluster, 1) == 0.0


def test_a_split_block_adds_an_all_reduce_per_row_wise_forward_and_column_wise_backward() -> None:
    """A GPT layer's plan (q, k, v and MLP-in column-wise, attention-out and MLP-out
    row-wise), recorded by the profiler: its forward all-reduces the 2 row-wise outputs, its
    backward the 4 column-wise inputs' gradients (torch's ColwiseParallel, one each)."""
    from dataclasses import replace

    from tests.planning.partition.test_partition import make_profile

    from pipecast.measuring.profiler.tensor_parallel import reduces
    from pipecast.planning.recommend.mesh import tp_collectives
    from pipecast.values.hardware.presets import describe
    from pipecast.values.models.tensor_plans import GPT

    assert reduces(GPT) == (2, 4)
    profile = make_profile([1e-3], params=[4000])
    split = replace(profile.blocks[0], param_bytes=2000, tp_reduces=reduces(GPT))
    profile = replace(profile, tensor_parallel={2: (split,)})
    cluster = describe(gpus_per_node=2, memory="80GiB")
    one = cluster.allreduce_time(1000, range(2))
    assert tp_collectives(profile, 0, 1, 8, cluster, 2) == pytest.approx(2 * one)
    assert tp_collectives(profile, 0, 1, 8, cluster, 2, backward=True) == pytest.approx(4 * one)
