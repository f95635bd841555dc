"""least_peak_memory: a bound on simulate's peak memory, read without timing the plan.

Each rank's actions are tallied in program order as the simulator tallies them; only the
transfer buffers NCCL keeps past their host's release (their bytes depend on the timing)
are left out, and those only add. So the bound is never above the simulated peak, and equal
to it wherever no such buffer is held: all of a plan's stages on one rank, or transfers of
zero bytes. The simulator is the reference; two cases are also checked by hand.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.planning.partition.test_partition import make_profile

from pipecast.errors import PipecastError
from pipecast.planning.recommend.enumerate import graphed, strategies
from pipecast.planning.recommend.predict import predict
from pipecast.planning.recommend.rank import offloaded
from pipecast.planning.schedules import make_plan
from pipecast.planning.simulation import Costs, StageTimes, simulate
from pipecast.planning.simulation.memory import least_peak_memory, program_order_peaks, reclaimed
from pipecast.values.hardware.presets import describe
from pipecast.values.plan.action import Plan

PLANS = [
    ("gpipe", 2, 4, 1),
    ("1f1b", 4, 8, 1),
    ("interleaved", 2, 4, 1),
    ("zb-h1", 4, 8, 1),
    ("zb-h1", 4, 8, 2),
    ("zb-v", 2, 6, 1),
    ("zb-v", 2, 8, 2),
    ("pipedream", 3, 6, 1),
]
"""(schedule, ranks, micro-batches, weight batch)."""

VARIANTS: dict[str, dict[str, object]] = {
    "eager": {},
    "all-but-last": {"recompute": "all-but-last"},
    "recomputed": {"recompute": "all"},
    "offloaded": {"offload": "activations"},
    "offloaded, all-but-last": {"offload": "activations", "recompute": "all-but-last"},
    "adam": {"optimizer": "adam"},  # the step's temporaries after the activations
    "graphed": {"cuda_graphs": True, "graph_pool_ratio": 1.25, "optimizer": "adam"},
}


def _stage(**fields: object) -> StageTimes:
    """A stage whose every memory term is non-zero and distinct: activations, the bytes
    crossing each boundary, workspace, gradients kept from B to W, a batched W's copies, a
    block's activations restored at once; copies to the host slower than the forward (a
    backlog of them on the device); a host that issues slower than some device work."""
    base: dict[str, object] = dict(
        forward=1.0, backward_input=1.0, backward_weight=1.5, backward=2.5,
        activation_bytes=1000, input_bytes=40, output_bytes=40, param_bytes=50,
        workspace_bytes=30, held_bytes=20, gather_bytes=7, weight_group=2.0,
        to_host=1.5, from_host=0.3, restored_bytes=300, host_forward=0.2,
        host_backward_input=0.2, host_backward_weight=0.2, host_backward=1.4,
    )  # fmt: skip
    return StageTimes(**{**base, **fields})  # type: ignore[arg-type]


def _costs(plan: Plan, moved: int = 40, **extra: object) -> Costs:
    """`plan`'s stages, `moved` bytes crossing each boundary each way, the first stage's
    input the data (nothing received) and the last stage's loss on top."""
    stages = [_stage(input_bytes=moved, output_bytes=moved) for _ in range(plan.num_stages)]
    stages[0] = replace(stages[0], input_bytes=0, batch_bytes=3)
    stages[-1] = replace(stages[-1], output_bytes=0, loss_bytes=60, batch_bytes=2)
    links = (0.7,) * (plan.num_stages - 1)
    return Costs(
        stages=tuple(stages),
        forward_transfer=links,
        backward_transfer=links,
        **extra,  # type: ignore[arg-type]
    )


def _plan(name: str, ranks: int, m: int, weight_batch: int) -> Plan:
    return make_plan(name, ranks, m, weight_batch=weight_batch)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize(("name", "ranks", "m", "wb"), PLANS)
def test_the_bound_is_never_above_the_simulated_peak(
    name: str, ranks: int, m: int, wb: int, variant: str
) -> None:
    plan = _plan(name, ranks, m, wb)
    costs = _costs(plan, **VARIANTS[variant])
    assert least_peak_memory(plan, costs) <= max(simulate(plan, costs, exposed=False).peak_memory)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize(("name", "ranks", "m", "wb"), PLANS)
def test_stopping_at_a_limit_is_over_it_exactly_where_the_whole_walk_is(
    name: str, ranks: int, m: int, wb: int, variant: str
) -> None:
    """Given a limit, the walk may stop early, but only where the whole walk's bound is over
    the limit too: at the bound itself it is not over, a byte below it, it is."""
    plan = _plan(name, ranks, m, wb)
    costs = _costs(plan, **VARIANTS[variant])
    whole = least_peak_memory(plan, costs)
    assert least_peak_memory(plan, costs, whole) == whole
    early = least_peak_memory(plan, costs, whole - 1)
    assert whole - 1 < early <= whole


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize(("name", "ranks", "m", "wb"), PLANS)
def test_with_nothing_crossing_the_bound_is_the_peak(
    name: str, ranks: int, m: int, wb: int, variant: str
) -> None:
    """Transfers of zero bytes: the buffers the bound leaves out hold nothing, and every
    other term is tallied as the simulator tallies it."""
    plan = _plan(name, ranks, m, wb)
    costs = _costs(plan, moved=0, **VARIANTS[variant])
    peak = max(simulate(plan, costs, exposed=False).peak_memory)
    assert least_peak_memory(plan, costs) == peak


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize(
    ("name", "m", "wb"),
    [("gpipe", 4, 1), ("1f1b", 4, 1), ("zb-h1", 4, 2), ("interleaved", 4, 1), ("zb-v", 6, 2)],
)
def test_on_one_rank_the_bound_is_the_peak(name: str, m: int, wb: int, variant: str) -> None:
    """All of a plan's stages on one rank (interleaved and ZB-V put two there): its
    boundaries' bytes never leave the rank, so no transfer buffer is held."""
    plan = _plan(name, 1, m, wb)
    costs = _costs(plan, **VARIANTS[variant])
    assert least_peak_memory(plan, costs) == simulate(plan, costs, exposed=False).peak_memory[0]


def test_the_bound_by_hand_on_one_rank() -> None:
    """GPipe, one stage, 4 micro-batches of 100 bytes, 10 of them the input (the numbers of
    test_offload_pricing's): kept, 400 and the input's 10-byte gradient in a backward (410);
    offloaded, four inputs (40), one micro-batch's 90 back and the 10 (140)."""
    plan = make_plan("gpipe", 1, 4)
    st = StageTimes(
        forward=1.0, backward_input=1.0, backward_weight=1.0, backward=2.0,
        activation_bytes=100, input_bytes=10, to_host=0.25, from_host=0.5,
    )  # fmt: skip
    assert least_peak_memory(plan, Costs(stages=(st,))) == 410
    assert least_peak_memory(plan, Costs(stages=(st,), offload="activations")) == 140


def _two_stages() -> Costs:
    """GPipe's two stages of the hand cases: 1000 and 500 bytes saved a micro-batch, 10
    crossing, 'all-but-last'."""
    first = StageTimes(
        forward=1, backward_input=1, backward_weight=1, backward=2, activation_bytes=1000,
        output_bytes=10,
    )  # fmt: skip
    last = replace(first, output_bytes=0, input_bytes=10, activation_bytes=500)
    return Costs(stages=(first, last), recompute="all-but-last")


def test_the_bound_by_hand_below_the_simulated_peak() -> None:
    """GPipe, 2 stages saving 1000 and 500 bytes a micro-batch, 10 bytes crossing, 4
    micro-batches, 'all-but-last' (test_memory_terms' case, the second stage lighter). The
    first rank keeps micro-batch 3 whole (1000) and nothing of 0-2 (its input is the data);
    in a recomputing backward it holds 1000 recomputed and the 10-byte gradient received:
    2010 in program order. The second: 500 + 3 x 10 kept, 500 recomputed and the 10 it
    sends, 1040. The host, costing nothing, runs ahead of its device, so the simulated first
    rank also still holds two earlier gradients (2030), which the bound leaves out."""
    costs = _two_stages()
    plan = make_plan("gpipe", 2, 4)
    assert simulate(plan, costs).peak_memory == (2030, 1040)
    assert least_peak_memory(plan, costs) == 2010


def test_the_bound_holds_for_strategies_priced_from_a_profile() -> None:
    """Every strategy on up to 4 GPUs of a 4-block profile (a batch of 8), as the runtime
    runs it (graphed) and with its activations, optimizer or weights on the host, priced by
    predict: the bound on its plan under its own costs is no more than the predicted peak,
    and below it for some (those whose ranks hold transfer buffers)."""
    profile = make_profile([1e-3] * 4, params=[10**6] * 4, saved=[10**6] * 4)
    cluster = describe(gpus_per_node=4, memory="80GiB", intra_bandwidth="100GB/s")
    checked = below = 0
    for base in graphed(strategies(4, 8, blocks=4)):
        for s in [base, *offloaded(base, "adam")]:
            try:
                pred = predict(profile, cluster, s, 8, optimizer="adam", exposed=False)
            except PipecastError:
                continue
            if pred.unexposed is None:  # FSDP on one stage: not simulated
                continue
            costs, _ = pred.unexposed
            least = least_peak_memory(pred.plan, costs)
            assert least <= pred.peak_memory, s.label()
            checked += 1
            below += least < pred.peak_memory
    assert checked > 100 and below > 0


def test_program_order_peaks_by_hand() -> None:
    """The case above, rank by rank: 2010 and 1040 in program order."""
    costs = _two_stages()
    assert program_order_peaks(make_plan("gpipe", 2, 4), costs) == (2010, 1040)


@pytest.mark.parametrize(
    ("limit", "held"),
    [(2030, (2030, 1040)), (2020, (2020, 1040)), (2010, (2010, 1040)), (2000, (2010, 1040))],
)
def test_a_limit_reclaims_the_buffers_held_in_flight(limit: int, held: tuple[int, ...]) -> None:
    """The same case's simulated peaks, (2030, 1040), on GPUs of `limit` bytes: the first
    rank's two gradients in flight (20 bytes past its program order) fill the room up to the
    limit and no further; below its program order (2010) it needs that, and does not fit."""
    costs = _two_stages()
    assert reclaimed((2030, 1040), make_plan("gpipe", 2, 4), costs, limit) == held


def test_a_pipeline_fits_where_only_its_buffers_in_flight_were_over() -> None:
    """Two stages sending 100 MB a micro-batch over a 1 GB/s link, their hosts far ahead of
    their devices: simulated on a roomy GPU, the buffers NCCL holds raise a rank's peak past
    its program order. On a GPU whose room lies between the two the plan fits, its peak the
    room itself, and its step is the roomy GPU's."""
    profile = make_profile([1e-3] * 4, out_bytes=[10**8] * 4, saved=[10**6] * 4)
    roomy = describe(gpus_per_node=2, memory="80GiB", intra_bandwidth="1GB/s")
    pipelines = [
        s for s in strategies(2, 64, blocks=4) if s.kind == "pipeline" and s.schedule == "1f1b"
    ]
    s = max(pipelines, key=lambda s: s.microbatches)
    wide = predict(profile, roomy, s, 64, memory_margin=0.0, exposed=False)
    assert wide.unexposed is not None
    costs, _ = wide.unexposed
    order = program_order_peaks(wide.plan, costs)
    simulated = simulate(wide.plan, costs, exposed=False).peak_memory
    assert max(simulated) > max(order)
    room = (max(order) + max(simulated)) // 2
    tight = replace(roomy, memory_bytes=room)
    pred = predict(profile, tight, s, 64, memory_margin=0.0, exposed=False)
    assert pred.fits
    assert max(pred.timeline.peak_memory) == room
    assert pred.step_time == wide.step_time
