"""A sharded data-parallel step (FSDP) simulated on unit costs, checked against timelines and
memory worked out by hand from the rules in planning/simulation/sharded.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.planning.partition.test_partition import make_profile

from pipecast.planning.recommend.mesh import sharded_stages
from pipecast.planning.recommend.predict import predict
from pipecast.planning.simulation.pricing import costs_from_profile
from pipecast.planning.simulation.sharded import ShardedStep, Unit, sharded_step
from pipecast.values.hardware.presets import describe
from pipecast.values.partition import Partition, Stage
from pipecast.values.profile.types import Profile
from pipecast.values.strategy import Strategy


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


def test_a_split_block_without_its_counts_is_priced_as_a_gpt_block() -> None:
    """Two blocks, one split over 2 ranks (its weights halve in the rank's profile) in a
    profile that did not record its all-reduces, the other whole: the split one adds a GPT
    block's 2 all-reduces of its 1000-byte output to the forward and 4 to the backward, the
    whole one none."""
    from dataclasses import replace

    from tests.planning.partition.test_partition import make_profile

    from pipecast.planning.recommend.mesh import tp_collectives
    from pipecast.values.hardware.presets import describe

    profile = make_profile([1e-3] * 2, params=[4000, 4000])
    halved = replace(profile.blocks[0], param_bytes=2000)
    profile = replace(profile, tensor_parallel={2: (halved, profile.blocks[1])})
    cluster = describe(gpus_per_node=2, memory="80GiB")
    one = cluster.allreduce_time(1000, range(2))
    assert halved.tp_reduces is None
    assert tp_collectives(profile, 0, 2, 8, cluster, 2) == pytest.approx(2 * one)
    assert tp_collectives(profile, 0, 2, 8, cluster, 2, backward=True) == pytest.approx(4 * one)
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


def test_a_profile_measured_in_shares_alone_prices_its_all_reduces() -> None:
    """A model too large for one GPU whole is profiled as one rank's share, which stands for
    the whole blocks too (weights as small): its split blocks still all-reduce, as the
    profiler recorded (tp_reduces); an unsplit block (no record) does not."""
    from dataclasses import replace

    from tests.planning.partition.test_partition import make_profile

    from pipecast.planning.recommend.mesh import tp_collectives
    from pipecast.values.hardware.presets import describe

    profile = make_profile([1e-3] * 2, params=[2000, 2000])
    split = replace(profile.blocks[0], tp_reduces=(2, 4))
    profile = replace(profile, tensor_parallel={2: (split, profile.blocks[1])})
    cluster = describe(gpus_per_node=2, memory="80GiB")
    one = cluster.allreduce_time(1000, range(2))
    assert tp_collectives(profile, 0, 2, 8, cluster, 2) == pytest.approx(2 * one)
    assert tp_collectives(profile, 0, 2, 8, cluster, 2, backward=True) == pytest.approx(4 * one)
    assert tp_collectives(profile, 1, 2, 8, cluster, 2) == 0.0


def _fsdp_profile() -> Profile:
    """Four blocks of 3 GB of weights each, 1 ms forward, and an optimizer step of 8 ms a
    block (nothing fixed on top)."""
    profile = make_profile([1e-3] * 4, params=[3_000_000_000] * 4)
    return replace(profile, blocks=tuple(replace(b, optimizer_step=8e-3) for b in profile.blocks))


def test_fsdp_collects_and_steps_each_replicas_shard() -> None:
    """FSDP x4 on one node (10 us, 150 GB/s, no collective readings: a ring, half an
    all-reduce each): each 3 GB block is gathered and reduce-scattered in 3 x 10 us +
    3/4 x 3e9 / 150e9 = 15.03 ms, and each replica steps a quarter of the weights, so the
    step ends with 4 x 8 ms / 4 = 8 ms of optimizer, not 32."""
    fsdp = Strategy(kind="data", replicas=4, shard="full")
    cluster = describe(gpus_per_node=4, memory="80GiB")
    t = predict(_fsdp_profile(), cluster, fsdp, 32, optimizer="sgd").timeline
    collectives = [e.duration for e in t.events if e.kind in ("allgather", "reduce_scatter")]
    assert len(collectives) == 4 + 3 + 4  # gathers for the forward and again for the
    # backward (the last block's kept), a reduce-scatter each
    assert collectives == pytest.approx([15.03e-3] * 11)
    [step] = [e for e in t.events if e.kind == "optimizer"]
    assert step.duration == pytest.approx(8e-3)
    assert t.step_time == pytest.approx(step.end)


def test_a_sharded_pipeline_stage_reduce_scatters_and_steps_its_shard() -> None:
    """FSDP x2 x 2 stages of two 3 GB blocks, on one node (10 us, 150 GB/s, no collective
    readings: a ring, half an all-reduce each way). After its last backward each stage
    reduce-scatters its 6 GB over 2 replicas: 10 us + 1/2 x 6e9 / 150e9 = 20.01 ms (an
    all-reduce would take twice that); before its first forward it gathers its first block:
    10 us + 1/2 x 3e9 / 150e9 = 10.01 ms; and each replica steps its half of the stage's
    2 x 8 ms of optimizer."""
    profile = _fsdp_profile()
    cluster = describe(gpus_per_node=4, memory="80GiB")
    part = Partition(stages=(Stage(0, 2, (0, 2)), Stage(2, 4, (1, 3))), num_blocks=4)
    costs = sharded_stages(costs_from_profile(profile, part, 8, cluster), profile, part, cluster)
    assert costs.allreduce == pytest.approx((20.01e-3, 20.01e-3))
    assert costs.lead == pytest.approx((10.01e-3, 10.01e-3))
    assert costs.shards == (2, 2)
    assert [st.optimizer for st in costs.stages] == pytest.approx([8e-3, 8e-3])
