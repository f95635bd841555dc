"""How the simulator prices what is kept on the host (Costs.offload): activations' copies out
overlap the forward, the copies back lengthen the backward, and the GPU holds only the
received input between them while the host holds the rest; the optimizer's state and
streamed weights trade device memory for copies and a host step."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.planning.partition.test_partition import make_profile

from pipecast.planning.recommend.predict import Prediction, predict
from pipecast.planning.schedules.generators import make_plan
from pipecast.planning.simulation.costs import Costs, StageTimes
from pipecast.planning.simulation.memory import copies_under_way
from pipecast.planning.simulation.simulator import simulate
from pipecast.values.hardware.presets import describe
from pipecast.values.strategy import Strategy
from pipecast.values.training import OFFLOAD_IN_FLIGHT


def _stage(to_host: float) -> StageTimes:
    return StageTimes(
        forward=1.0, backward_input=1.0, backward_weight=1.0, backward=2.0,
        activation_bytes=100, input_bytes=10, to_host=to_host, from_host=0.5,
    )  # fmt: skip


@pytest.mark.parametrize(("to_host", "forward"), [(3.0, 3.0), (0.25, 1.0)])
def test_one_stage_step_and_memory(to_host: float, forward: float) -> None:
    """One micro-batch: the forward takes the longer of itself and its copies out (3 s of
    copies bind; 0.25 s hide), the backward its 2 s and 0.5 s of copies back."""
    plan = make_plan("1f1b", 1, 1)
    plain = simulate(plan, Costs(stages=(_stage(to_host),)))
    moved = simulate(plan, Costs(stages=(_stage(to_host),), offload="activations"))
    assert plain.step_time == pytest.approx(3.0)
    assert moved.step_time == pytest.approx(forward + 2.0 + 0.5)
    assert plain.peak_memory[0] - moved.peak_memory[0] == 0  # all 100 back for the backward
    assert moved.peak_host_memory == (90,)
    assert plain.peak_host_memory == ()


def test_micro_batches_in_flight_leave_their_activations_on_the_host() -> None:
    """GPipe, 1 stage, 4 micro-batches: all four forwards before any backward. The GPU holds
    four inputs (40) and, in a backward, one micro-batch's activations brought back (90)
    and the input's gradient (10): 140, against 400 kept and 10; the host holds 4 x 90."""
    plan = make_plan("gpipe", 1, 4)
    st = _stage(0.25)
    plain = simulate(plan, Costs(stages=(st,)))
    moved = simulate(plan, Costs(stages=(st,), offload="activations"))
    assert plain.peak_memory[0] == 410
    assert moved.peak_memory[0] == 140
    assert moved.peak_host_memory == (360,)


def test_recomputed_micro_batches_keep_nothing_to_move() -> None:
    plan = make_plan("gpipe", 1, 4)
    st = replace(_stage(3.0), forward=1.0)
    both = simulate(plan, Costs(stages=(st,), offload="activations", recompute="all"))
    only = simulate(plan, Costs(stages=(st,), recompute="all"))
    assert both.step_time == pytest.approx(only.step_time)
    assert both.peak_host_memory == (0,)


def test_a_backward_brings_back_one_block_at_a_time() -> None:
    """With the largest block's 30 bytes back at once instead of all 90, one micro-batch
    peaks at its input, those 30 and the input's gradient: 50, against 110 kept."""
    plan = make_plan("1f1b", 1, 1)
    st = replace(_stage(0.25), restored_bytes=30)
    assert simulate(plan, Costs(stages=(st,))).peak_memory[0] == 110
    assert simulate(plan, Costs(stages=(st,), offload="activations")).peak_memory[0] == 50


@pytest.mark.parametrize(("offload", "step"), [("weights", 1.5 + 2.0), ("all", 1.5 + 4.0)])
def test_restored_activations_queue_behind_the_streamed_weights(offload: str, step: float) -> None:
    """One micro-batch, weights streamed in 1.5 s an action. The forward takes the longest of
    its 1 s, the weights' 1.5 s and the copies out's 0.25 s (the other way on the link).
    Weights alone come in beside the 2 s backward; with activations restored too, the
    restores (0.5 s, on the compute stream) wait behind the weights on the same link
    direction, so the backward takes 2 + 0.5 + 1.5 = 4 s."""
    plan = make_plan("1f1b", 1, 1)
    st = replace(_stage(0.25), weights_in=1.5)
    assert simulate(plan, Costs(stages=(st,), offload=offload)).step_time == pytest.approx(step)


GPU_80 = describe(gpus_per_node=1, memory="80GiB")


BACKWARD = 4 * 2e-3
"""The four blocks' backward at batch 8 in make_profile's profile (2 ms a block)."""


def _adam_on_one_gpu(offload: str, *, graphs: bool = False) -> Prediction:
    """Four blocks of 1 GiB of weights under Adam on one GPU of 80 GiB, batch 8."""
    profile = make_profile([1e-3] * 4, params=[2**30] * 4)
    strategy = Strategy(kind="single", offload=offload, cuda_graphs=graphs)  # type: ignore[arg-type]
    return predict(profile, GPU_80, strategy, 8, optimizer="adam")


def test_an_optimizer_on_the_host_trades_its_state_for_copies_and_a_host_step() -> None:
    """Adam on one GPU, 4 GiB of weights: on the host, its 8 GiB of state leave the GPU, and
    so do the 4 GiB of square roots its step allocates beside them (the step's peak, the
    activations long gone), and the gradients but two blocks' in flight (2 of 4 GiB); the
    host holds weights, gradients and state (16 GiB). The gradients leave beside the
    backward (which takes the copy's time, not its 8 ms), and the host's pass and the
    weights' copy back (each block's beside the next block's pass: the longer of the two)
    follow block by block beside it: after it, what is left of them."""
    gib, gpu = 2**30, GPU_80
    plain, hosted = (_adam_on_one_gpu(o) for o in ("none", "optimizer"))
    # the activations and the batch, a few KiB, are what the square roots replace
    assert plain.peak_memory - hosted.peak_memory == pytest.approx(14 * gib, abs=2**20)
    assert hosted.peak_host_memory == 16 * gib and plain.peak_host_memory == 0
    moved = gpu.host_link.time(4 * gib)
    host = max(moved, 4 * gib / gpu.host_optimizer_rate)  # stepping beside copying back
    copies = (moved - BACKWARD) + (host - BACKWARD)
    assert hosted.step_time - plain.step_time == pytest.approx(copies)


def test_a_graphed_host_step_waits_for_the_whole_backward() -> None:
    """CUDA graphs run no gradient hooks (pipecast.runtime.host_step): the gradients stay
    on the device until the step's end, then leave, are stepped and come back, in turn."""
    gib, gpu = 2**30, GPU_80
    plain, hosted = (_adam_on_one_gpu(o, graphs=True) for o in ("none", "optimizer"))
    assert plain.peak_memory - hosted.peak_memory == pytest.approx(12 * gib, abs=2**20)
    copies = 2 * gpu.host_link.time(4 * gib) + 4 * gib / gpu.host_optimizer_rate
    assert hosted.step_time - plain.step_time == pytest.approx(copies)


@pytest.mark.parametrize(
    ("dtype", "autocast", "rate"),
    [("fp32", False, 4e9), ("bf16", False, 1e9), ("fp16", False, 1e9), ("bf16", True, 4e9)],
)
def test_the_host_step_is_priced_at_its_weights_dtype(
    dtype: str, autocast: bool, rate: float
) -> None:
    """16-bit weights step on the host at the 16-bit rate (each element widened and narrowed
    back), fp32 ones and autocast's (fp32 weights, cast as ops run) at the fp32 rate: the
    4 GiB of weights take 4 GiB / that rate beside the copies (both beside the backward,
    as the test above has it)."""
    gib = 2**30
    gpu = replace(GPU_80, host_optimizer_rate=4e9, host_optimizer_rate_16=1e9)
    profile = replace(make_profile([1e-3] * 4, params=[2**30] * 4), dtype=dtype, autocast=autocast)
    plain, hosted = (
        predict(profile, gpu, Strategy(kind="single", offload=o), 8, optimizer="adam")
        for o in ("none", "optimizer")
    )
    moved = gpu.host_link.time(4 * gib)
    copies = moved + max(moved, 4 * gib / rate) - 2 * BACKWARD
    assert hosted.step_time - plain.step_time == pytest.approx(copies)


def test_streamed_weights_leave_the_gradients_and_two_blocks() -> None:
    """Four blocks of 1 GiB under Adam on one GPU, streamed: against the optimizer alone on
    the host, the GPU gives back the weights but two blocks' (4 GiB less 2); the forward
    and the backward each take at least the copy of the 4 GiB in, and the step copies the
    gradients out but no weights back."""
    gib, gpu = 2**30, GPU_80
    hosted, streamed = (_adam_on_one_gpu(o) for o in ("optimizer", "weights"))
    assert hosted.peak_memory - streamed.peak_memory == 2 * gib
    assert streamed.peak_host_memory == hosted.peak_host_memory == 16 * gib
    moved = gpu.host_link.time(4 * gib)
    took = {e.kind: e.end - e.start for e in streamed.timeline.events}
    assert took["F"] == pytest.approx(moved) and took["BW"] == pytest.approx(moved)
    plain = {e.kind: e.end - e.start for e in hosted.timeline.events}
    step = 4 * gib / gpu.host_optimizer_rate  # no weights back beside the host's pass
    assert plain["optimizer"] - took["optimizer"] == pytest.approx(max(step, moved) - step)


def test_a_rank_that_offloads_issues_no_further_ahead_than_its_device() -> None:
    """GPipe's first stage, four forwards of 1 s whose 10-byte outputs leave in 0.1 s each,
    nothing saved: a host free to run ahead allocates all four outputs at once, before any
    has left (40 bytes); one that copies activations through pinned memory waits for its
    device, so each output has left before the next is made (10)."""
    st0 = StageTimes(
        forward=1.0, backward_input=1.0, backward_weight=1.0, backward=2.0, output_bytes=10
    )
    st1 = replace(st0, output_bytes=0, input_bytes=10)
    plan = make_plan("gpipe", 2, 4)
    links = {"forward_transfer": (0.1,), "backward_transfer": (0.1,)}
    free = simulate(plan, Costs(stages=(st0, st1), **links))  # type: ignore[arg-type]
    paced = simulate(plan, Costs(stages=(st0, st1), offload="activations", **links))  # type: ignore[arg-type]
    assert free.peak_memory[0] == 40 and paced.peak_memory[0] == 10
    assert paced.step_time == pytest.approx(free.step_time)


def test_a_forward_outrunning_the_link_holds_the_copies_under_way() -> None:
    """Copies out slower than the forward (3 s against 1): the device keeps every saved
    tensor whose copy is not done, up to the runtime's bound, so the forward peaks at its
    input and the 90 bytes under way (100), above the backward's 50 (input, the largest
    block's 30 back, the input's gradient). Where the link keeps up (0.25 s), nothing piles
    up and the backward's 50 is the peak."""
    plan = make_plan("1f1b", 1, 1)
    lagging = replace(_stage(3.0), restored_bytes=30)
    keeping_up = replace(_stage(0.25), restored_bytes=30)
    assert simulate(plan, Costs(stages=(lagging,), offload="activations")).peak_memory[0] == 100
    assert simulate(plan, Costs(stages=(keeping_up,), offload="activations")).peak_memory[0] == 50
    huge = replace(lagging, activation_bytes=OFFLOAD_IN_FLIGHT * 4, input_bytes=0)
    assert copies_under_way(huge) == OFFLOAD_IN_FLIGHT  # never more than the runtime lets pile up


def test_a_link_that_just_keeps_up_holds_no_copies_in_flight() -> None:
    """Copies out exactly as long as the forward (1 s each): each is done as the next tensor
    is saved, so none is held; a hair slower and the 90 bytes the stage saves pile up."""
    assert copies_under_way(_stage(1.0)) == 0
    assert copies_under_way(_stage(1.0 + 1e-9)) == 90


def test_streamed_and_recomputed_actions_take_no_less_than_the_weights_copy() -> None:
    """ZB-H1, two stages, one micro-batch, each stage's weights in in 1.5 s, recomputed.
    Stage 1: F max(1, 1.5) = 1.5; B its 1 s and the forward again, 2 s, over the one copy
    its recomputation and its backward share; W recomputes too, so copies the weights
    again: max(1, 1.5) = 1.5. Stage 0 has no W (its B is its whole backward): 0. Without
    recomputation W copies nothing (1 s) and B is its own 1 s under the copy (1.5)."""
    st1 = replace(_stage(0.25), weights_in=1.5)
    st0 = replace(st1, backward_input=2.0, backward_weight=0.0)
    plan = make_plan("zb-h1", 2, 1)

    def took(recompute: str) -> dict[str, float]:
        costs = Costs(stages=(st0, st1), offload="weights", recompute=recompute)  # type: ignore[arg-type]
        t = simulate(plan, costs)
        return {f"{e.stage}{e.kind}": e.end - e.start for e in t.events if e.kind in "FBW"}

    assert took("all") == pytest.approx(
        {"0F": 1.5, "1F": 1.5, "1B": 2.0, "1W": 1.5, "0B": 3.0, "0W": 0.0}
    )
    assert took("none") == pytest.approx(
        {"0F": 1.5, "1F": 1.5, "1B": 1.5, "1W": 1.0, "0B": 2.0, "0W": 0.0}
    )


def test_a_streamed_stage_recomputes_one_checkpoint_at_a_time() -> None:
    """Blocks of weights 10, 0, 10, 10 bytes, outputs 100-400, saving 1000-4000: streamed
    and recomputed, checkpoints [0 1] [2] [3]. A micro-batch keeps the inputs of [2] and
    [3] (outputs of blocks 1 and 2: 500) and its backward recomputes at most block 3's 4000,
    where the whole model recomputed with its weights on the device is a checkpoint per
    block: it keeps blocks 0-2's outputs (600) and recomputes at most 4000, 5400 below its
    unrecomputed peak (one checkpoint over the stage would bring all 10000 back at once and
    save nothing). A stage from block 1, [1 2] [3], keeps its received 100 and block 2's
    300; recomputes 5000."""
    from pipecast.planning.simulation.pricing import checkpoints

    profile = make_profile(
        [1e-3] * 4,
        params=[10, 0, 10, 10],
        out_bytes=[100, 200, 300, 400],
        saved=[1000, 2000, 3000, 4000],
    )
    assert checkpoints(profile, 0, 4, 8) == (500, 4000)
    assert checkpoints(profile, 1, 4, 8) == (400, 5000)

    def peak(offload: str, recompute: str) -> int:
        strategy = Strategy(kind="single", offload=offload, recompute=recompute)  # type: ignore[arg-type]
        return predict(profile, GPU_80, strategy, 8).peak_memory

    assert peak("weights", "none") - peak("weights", "all") == 10000 - (500 + 4000)
    assert peak("optimizer", "none") - peak("optimizer", "all") == 10000 - (600 + 4000)
