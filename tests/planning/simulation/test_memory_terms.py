"""The memory terms allocator snapshots of graphed and eager runs showed the model lacked,
each simulated on one stage of hand-picked sizes and checked against its size by hand
(planning/simulation/memory.py, costs.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.planning.partition.test_partition import make_profile

from pipecast.planning.schedules import make_plan
from pipecast.planning.simulation import Costs, StageTimes, simulate
from pipecast.planning.simulation.pricing import LOSS_COPIES, graph_pool_ratio, loss_bytes

PARAMS, ACTIVATIONS = 1000, 400
"""One stage: 1000 weight bytes, 400 activation bytes a micro-batch, nothing else."""


def _peak(costs: Costs) -> int:
    plan = make_plan("1f1b", 1, 1)
    return simulate(plan, costs, exposed=False).peak_memory[0]


def _one_stage(**fields: object) -> Costs:
    st = StageTimes(
        forward=1, backward_input=1, backward_weight=1, backward=2, param_bytes=PARAMS,
        activation_bytes=ACTIVATIONS,
    )  # fmt: skip
    return Costs(stages=(st,), optimizer="adam", **fields)  # type: ignore[arg-type]


def test_a_graphed_optimizer_step_comes_on_top_of_the_activations() -> None:
    """Adam holds weights, gradients and two moments (4 x 1000) and allocates a square root of
    every second moment in its step (1000). Eagerly the step reuses what the activations
    freed: 4000 + max(400, 1000) = 5000. Graphed, the activations sit in the graphs' pool,
    which the step cannot use: 4000 + 400 + 1000 = 5400."""
    assert _peak(_one_stage()) == 5000
    assert _peak(_one_stage(cuda_graphs=True)) == 5400


def test_the_graphs_pool_holds_its_measured_share_more() -> None:
    """A pool that reserves 1.5 x what the blocks take eagerly: 4000 + 400 x 1.5 + 1000."""
    assert _peak(_one_stage(cuda_graphs=True, graph_pool_ratio=1.5)) == 5600


def test_the_loss_holds_two_fp32_copies_of_the_output() -> None:
    """A last stage whose loss holds 300 bytes on top while it runs, forward and backward:
    eagerly 4000 + max(400 + 300, 1000); with SGD (no state, no step temporaries) 1000 +
    400 + 300. The loss of a bf16 model whose last block outputs 2,000 bytes (1,000
    elements): 8 bytes an element, 8,000."""
    costs = _one_stage()
    with_loss = replace(costs, stages=(replace(costs.stages[0], loss_bytes=300),))
    assert _peak(with_loss) == 5000
    sgd = replace(with_loss, optimizer="sgd")
    assert _peak(sgd) == 2 * PARAMS + ACTIVATIONS + 300
    profile = replace(make_profile([1e-3] * 2, out_bytes=[10, 2000]), dtype="bf16")
    assert LOSS_COPIES == 8 and loss_bytes(profile, 8) == 8000


def test_the_all_reduce_copies_the_gradients_after_the_last_backward() -> None:
    """pipecast's all-reduce gathers a replicated stage's gradients into flat buckets (a
    second 1000) from its last backward to the optimizer step. With SGD: 2000 + max(400,
    1000) = 3000 eagerly; graphed, on top of the pool: 2000 + 400 + 1000 = 3400. torch's
    DDP holds its buckets all along (grad_bytes_factor 2): 3000 + 400, no copy on top."""
    sgd = replace(_one_stage(), optimizer="sgd", allreduce=(1e-3,))
    assert _peak(sgd) == 3000
    assert _peak(replace(sgd, cuda_graphs=True)) == 3400
    assert _peak(replace(sgd, grad_bytes_factor=2.0)) == 3400


def test_the_pool_ratio_is_the_profiles_own_measurement() -> None:
    """Two blocks saving 1000 bytes each (the input counted) and no transient: 2000 eagerly.
    A whole-model graph pool of 3000 makes 1.5; none, or a smaller one, 1."""
    profile = make_profile([1e-3] * 2)
    assert graph_pool_ratio(profile) == 1.0
    assert graph_pool_ratio(replace(profile, graph_pool={8: 3000})) == pytest.approx(1.5)
    assert graph_pool_ratio(replace(profile, graph_pool={8: 1500})) == 1.0


def test_the_last_micro_batch_is_not_recomputed_in_its_backward() -> None:
    """'all-but-last', 1F1B on one stage saving 1000 bytes a micro-batch, 2 micro-batches:
    micro-batch 0 keeps nothing (a first stage's input is the data) and its backward runs
    its forward again (1000); micro-batch 1 keeps its 1000 and its backward recomputes
    nothing: 1000, as without recomputation, not 2000."""
    plan = make_plan("1f1b", 1, 2)
    st = StageTimes(
        forward=1, backward_input=1, backward_weight=1, backward=2, activation_bytes=1000
    )
    assert simulate(plan, Costs(stages=(st,), recompute="all-but-last")).peak_memory == (1000,)
    assert simulate(plan, Costs(stages=(st,))).peak_memory == (1000,)


@pytest.mark.parametrize(
    ("recompute", "peaks"), [("none", (4010, 4010)), ("all-but-last", (2030, 2040))]
)
def test_all_but_last_keeps_only_the_last_micro_batch_whole(
    recompute: str, peaks: tuple[int, int]
) -> None:
    """GPipe, 2 stages saving 1000 bytes a micro-batch, 10 bytes crossing between them, 4
    micro-batches, every forward before any backward; the host, costing nothing, issues
    ahead, so the gradients each backward received stay until their receives are done.
    Without recomputation each rank keeps 4 x 1000, and its first backward holds a
    10-byte gradient on top: 4010. 'all-but-last' keeps micro-batch 3 whole (1000) and of
    micro-batches 0-2 only what they received: nothing on the first stage, 10 each on the
    second (1030). Rank 0 peaks in the backward of micro-batch 2, the last it recomputes:
    1000 kept + 1000 recomputed + its 10-byte gradient + the 2 x 10 still in flight = 2030;
    rank 1 in its first backward: 1030 + 1000 recomputed + the 10-byte gradient it sends =
    2040."""
    first = StageTimes(
        forward=1, backward_input=1, backward_weight=1, backward=2, activation_bytes=1000,
        output_bytes=10,
    )  # fmt: skip
    last = replace(first, output_bytes=0, input_bytes=10)
    costs = Costs(stages=(first, last), recompute=recompute)  # type: ignore[arg-type]
    assert simulate(make_plan("gpipe", 2, 4), costs).peak_memory == peaks
