"""The simulator's CUDA-graphed runs: one launch per action, static buffers held."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipecast.planning.schedules.generators import make_plan
from pipecast.planning.simulation.costs import Costs, StageTimes
from pipecast.planning.simulation.simulator import simulate

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


def test_a_graphed_action_costs_its_host_one_launch_loss_included() -> None:
    plan = make_plan("gpipe", 2, 4)
    graphed = simulate(plan, Costs(stages=(HOST_BOUND,) * 2, host_overhead=0.25, cuda_graphs=True))
    assert graphed.host_busy == pytest.approx([8 * 0.25, 8 * 0.25])  # 4 F and 4 BW each


DEVICE_BOUND = replace(HOST_BOUND, host_forward=0.0, host_backward=0.0, batch_bytes=3)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1"])
def test_graphed_memory_is_the_eager_steps_and_the_static_buffers(name: str) -> None:
    """The graphs' temporaries come and go as an eager step's do; on top, each rank holds
    per micro-batch: stage 0 its data (3 bytes) and output (7) and the output's gradient it
    receives (7); the last stage its targets (3), the input it receives (7) and the input's
    gradient it sends (7)."""
    plan = make_plan(name, 2, 4)
    eager = simulate(plan, Costs(stages=(DEVICE_BOUND,) * 2))
    graphed = simulate(plan, Costs(stages=(DEVICE_BOUND,) * 2, cuda_graphs=True))
    assert graphed.step_time == pytest.approx(eager.step_time)
    for r in range(2):
        assert graphed.peak_memory[r] - eager.peak_memory[r] == 4 * (3 + 7 + 7)


def test_library_workspaces_are_kept_per_stream() -> None:
    """cuBLAS keeps its workspaces per stream: a rank once for its default stream, however
    many of its stages call cuBLAS, and once more for its graphs' stream; a rank whose
    stages call none keeps none."""
    blas, conv = replace(HOST_BOUND, kept_workspace=64), HOST_BOUND
    plan = make_plan("interleaved", 2, 4)  # stages 0 and 2 on rank 0, 1 and 3 on rank 1
    stages = (blas, conv, blas, conv)
    base = simulate(plan, Costs(stages=(conv,) * 4)).peak_memory
    eager = simulate(plan, Costs(stages=stages)).peak_memory
    assert [e - b for e, b in zip(eager, base, strict=True)] == [64, 0]
    base = simulate(plan, Costs(stages=(conv,) * 4, cuda_graphs=True)).peak_memory
    graphed = simulate(plan, Costs(stages=stages, cuda_graphs=True)).peak_memory
    assert [g - b for g, b in zip(graphed, base, strict=True)] == [64 * 2, 0]
