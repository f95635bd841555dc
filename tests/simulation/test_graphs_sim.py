"""The simulator's CUDA-graphed runs: one launch per action, every slot's memory held."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipecast.errors import ConfigError
from pipecast.hardware.allocator import LARGE_SEGMENT, SMALL_SEGMENT, slot_reserved
from pipecast.schedule.generators import make_plan
from pipecast.simulation.costs import Costs, StageTimes
from pipecast.simulation.simulator import simulate

HOST_BOUND = StageTimes(
    forward=1.0,
    backward_input=1.0,
    backward_weight=1.0,
    backward=2.0,
    host_forward=4.0,
    host_backward=5.0,
    activation_bytes=100,
    workspace_bytes=10,
    param_bytes=1000,
    output_bytes=7,
    input_bytes=7,
)


def test_graphs_leave_the_host_only_the_runtimes_work() -> None:
    plan = make_plan("gpipe", 2, 4)
    eager = Costs(stages=(HOST_BOUND,) * 2, host_overhead=0.25)
    graphed = replace(eager, cuda_graphs=True)
    slow, fast = simulate(plan, eager), simulate(plan, graphed)
    device_bound = simulate(
        plan, Costs(stages=(replace(HOST_BOUND, host_forward=0.0, host_backward=0.0),) * 2)
    )
    # eager: every rank issues 4 x (4 + 0.25) of forwards and 4 x (5 + 0.25) of backwards
    assert slow.step_time >= 4 * 4.25 + 4 * 5.25
    assert fast.step_time < slow.step_time
    # graphed: the device's GPipe step, (M + stages - 1) x (F + BW), the runtime's host cost
    # per action hidden behind devices busier than it
    assert fast.step_time == pytest.approx(device_bound.step_time)
    assert fast.step_time == pytest.approx((4 + 1) * 3.0)
    assert max(fast.host_busy) == pytest.approx(8 * 0.25)


def test_a_graphed_last_stage_still_issues_its_loss() -> None:
    """The loss runs eagerly beside the graphs: its host time is the last stage's on top of
    the runtime's overhead, on forwards and whole backwards alike."""
    plan = make_plan("gpipe", 2, 4)
    loss = replace(HOST_BOUND, graph_host_forward=0.5, graph_host_backward=0.75)
    graphed = simulate(plan, Costs(stages=(HOST_BOUND, loss), host_overhead=0.25, cuda_graphs=True))
    assert graphed.host_busy[0] == pytest.approx(8 * 0.25)
    assert graphed.host_busy[1] == pytest.approx(8 * 0.25 + 4 * (0.5 + 0.75))


def test_graphed_memory_is_every_slot_for_the_whole_step() -> None:
    grads = 1000  # gradient bytes of each stage, one copy per slot while its backward runs
    per_slot = slot_reserved(0, 100 + 10 + grads)  # whole allocator segments
    for name, slots_per_rank in (("gpipe", [4, 4]), ("1f1b", [2, 1])):
        plan = make_plan(name, 2, 4)
        eager = simulate(plan, Costs(stages=(HOST_BOUND,) * 2))
        graphed = simulate(plan, Costs(stages=(HOST_BOUND,) * 2, cuda_graphs=True))
        for r, n in enumerate(slots_per_rank):
            static = 1000 * 2  # weights and their gradients (SGD keeps no state)
            # beyond its slots a graphed rank holds only 7-byte boundary tensors: up to M
            # sends in flight, the gradient received for its output, the one for its input
            extra = graphed.peak_memory[r] - static - n * per_slot
            assert 0 <= extra <= (4 + 2) * 7
            assert graphed.peak_memory[r] > eager.peak_memory[r]


def test_a_slots_pool_reserves_whole_segments_of_each_kind() -> None:
    """A slot's pool holds its small requests (at most 1 MiB) in 2 MiB segments and its
    larger ones in 20 MiB segments, each kind at its own fullest, and always at least one
    small segment (VGG-16/CIFAR-10 over 2 x H100: 28 MiB slots of one large and four small
    segments, 22 MiB ones of one large and one small)."""
    mib = 2**20
    assert slot_reserved(0, 0) == 0
    assert slot_reserved(1) == slot_reserved(2 * mib) == SMALL_SEGMENT == 2 * mib
    assert slot_reserved(2 * mib + 1) == 4 * mib  # small requests never take a large segment
    assert slot_reserved(0, 1) == SMALL_SEGMENT + LARGE_SEGMENT == 22 * mib
    assert slot_reserved(7.7 * mib, 14.3 * mib) == 28 * mib
    assert slot_reserved(1.4 * mib, 18.1 * mib) == 22 * mib
    assert slot_reserved(0, 20 * mib + 1) == 42 * mib
    assert slot_reserved(0, 1000 * mib) == 1002 * mib


def test_library_workspaces_are_kept_per_stream() -> None:
    """cuBLAS keeps its workspaces per stream: a rank once for its default stream, however
    many of its stages call cuBLAS, and a graphed stage once more for its capture stream;
    a rank whose stages call none keeps none."""
    blas, conv = replace(HOST_BOUND, kept_workspace=64), HOST_BOUND
    plan = make_plan("interleaved", 2, 4)  # stages 0 and 2 on rank 0, 1 and 3 on rank 1
    stages = (blas, conv, blas, conv)
    base = simulate(plan, Costs(stages=(conv,) * 4)).peak_memory
    eager = simulate(plan, Costs(stages=stages)).peak_memory
    assert [e - b for e, b in zip(eager, base, strict=True)] == [64, 0]
    base = simulate(plan, Costs(stages=(conv,) * 4, cuda_graphs=True)).peak_memory
    graphed = simulate(plan, Costs(stages=stages, cuda_graphs=True)).peak_memory
    assert [g - b for g, b in zip(graphed, base, strict=True)] == [64 * 3, 0]


def test_split_backward_plans_cannot_be_graphed() -> None:
    with pytest.raises(ConfigError, match="whole backwards"):
        simulate(make_plan("zb-h1", 2, 4), Costs(stages=(HOST_BOUND,) * 2, cuda_graphs=True))
