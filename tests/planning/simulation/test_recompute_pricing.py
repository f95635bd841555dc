"""Recomputation priced where FSDP shards the weights (planning/simulation/sharded.py, each
block a checkpoint of its own, as runtime/recompute.py runs it), checked against steps and
memory worked out by hand."""

from __future__ import annotations

import pytest
from tests.planning.partition.test_partition import make_profile

from pipecast.planning.recommend.mesh import sharded_stages
from pipecast.planning.recommend.predict import predict
from pipecast.planning.simulation.pricing import costs_from_profile
from pipecast.planning.simulation.sharded import ShardedStep, Unit, sharded_step
from pipecast.values.hardware.presets import describe
from pipecast.values.partition import Partition, Stage
from pipecast.values.strategy import Strategy

UNIT = Unit(
    forward=1.0,
    backward=2.0,
    gather=0.0,
    scatter=0.0,
    optimizer=0.1,
    param_bytes=100,
    activation_bytes=10,
    recompute=1.0,
    kept_bytes=2,
)


def test_a_recomputed_fsdp_step_runs_each_forward_again_and_keeps_only_inputs() -> None:
    """Three units (forward 1, backward 2, 100 weight bytes, 10 activation bytes of which a
    recomputed forward keeps 2) over 2 replicas, resharded after the forward. Time: 3 x 1 +
    3 x (2 + 1) + 0.3 = 12.3 against 9.3. Memory: shards 300; a plain micro-batch peaks at
    the last unit's backward, 30 activations + units 2 and 1 gathered (200) + its gradient
    and reduce-scatter input (200) = 430; recomputed, 6 kept + the last unit's 8 made again
    + 200 + 200 = 414. Under all-but-last with 2 micro-batches the plain one sets the
    peak, and one backward of three units recomputes: 2 x 3 + 3 x 3 + 3 x 2 + 0.3."""
    units = [UNIT] * 3
    plain = sharded_step(units, ShardedStep(replicas=2))
    every = sharded_step(units, ShardedStep(replicas=2, recomputed=1))
    assert (plain.step_time, every.step_time) == pytest.approx((9.3, 12.3))
    assert (plain.peak_memory[0], every.peak_memory[0]) == (730, 714)
    one = sharded_step(units, ShardedStep(replicas=2, microbatches=2, recomputed=1))
    assert one.step_time == pytest.approx(21.3)
    assert one.peak_memory[0] == 730


def test_fsdp_with_recomputation_is_predicted_slower_and_smaller() -> None:
    """FSDP x2 over four blocks of 1 ms forward, 4000 saved bytes and 1000-byte outputs: a
    recomputed step runs the four forwards again (4 ms), and its peak, the last block's
    backward, holds 3 x 1000 inputs + that block's 4000 made again (less its own 1000
    input, kept) instead of 4 x 4000: 10,000 bytes less."""
    profile = make_profile([1e-3] * 4, saved=[4000] * 4)
    cluster = describe(gpus_per_node=2, memory="80GiB")
    plain, again = (
        predict(profile, cluster, Strategy(kind="data", replicas=2, shard="full", recompute=r), 16)
        for r in ("none", "all")
    )
    assert again.step_time - plain.step_time == pytest.approx(4e-3, rel=1e-6)
    assert plain.peak_memory - again.peak_memory == 10_000


def test_a_recomputed_sharded_pipeline_stage_keeps_each_blocks_input() -> None:
    """FSDP x2 x 2 stages of two blocks (1000-byte outputs, 4000 saved each): recomputed,
    each block is a checkpoint, so the first stage keeps its first block's output (1000;
    its own input is the batch), the second its received input and its first block's
    output (2000); each backward makes one block's 4000 again at a time."""
    profile = make_profile([1e-3] * 4, saved=[4000] * 4)
    cluster = describe(gpus_per_node=4, memory="80GiB")
    part = Partition(stages=(Stage(0, 2, (0, 2)), Stage(2, 4, (1, 3))), num_blocks=4)
    costs = costs_from_profile(profile, part, 8, cluster, recompute="all")
    costs = sharded_stages(costs, profile, part, cluster, 8)
    assert [st.checkpoint_bytes for st in costs.stages] == [1000, 2000]
    assert [st.recomputed_bytes for st in costs.stages] == [4000, 4000]
