"""W of several micro-batches as one (runtime/weight_batch.py): the gradients of the same
micro-batches' W taken one by one, with one matrix product per weight instead of one per
micro-batch, and an input shared by several products concatenated once."""

from __future__ import annotations

import pytest
import torch
from tests.runtime.helpers import OpCounts
from torch import nn

from pipecast.errors import PlanError
from pipecast.planning.schedules.generators import make_plan
from pipecast.runtime.backward import WeightWork, backward_input, backward_weight
from pipecast.runtime.weight_batch import Deferred, batched_weight
from pipecast.values.plan.weight_groups import weight_groups

_aten = torch.ops.aten


class _Block(nn.Module):
    """Three projections of one input (a query, key and value), a LayerNorm, a Linear
    without bias."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.out = nn.Linear(8, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.q(x)) * self.k(x) + self.v(x)
        return self.out(self.norm(h))


def _works(block: _Block, k: int) -> tuple[list[WeightWork], dict[str, torch.Tensor]]:
    """B of `k` micro-batches of 5 rows each (the W left to do), and the gradients one
    autograd call over all of them gives."""
    torch.manual_seed(1)
    xs = [torch.randn(5, 8) for _ in range(k)]
    seeds = [torch.randn(5, 4) for _ in range(k)]
    block.zero_grad(set_to_none=True)
    sum((block(x) * g).sum() for x, g in zip(xs, seeds, strict=True)).backward()  # type: ignore[union-attr]
    want = {n: p.grad.clone() for n, p in block.named_parameters() if p.grad is not None}
    block.zero_grad(set_to_none=True)
    works = []
    for x, g in zip(xs, seeds, strict=True):
        leaf = x.clone().requires_grad_(True)
        _, work = backward_input(block(leaf), g, leaf, list(block.parameters()))
        works.append(work)
    return works, want


@pytest.mark.parametrize("k", [2, 3])
def test_batched_w_gives_the_gradients_of_one_autograd_call(k: int) -> None:
    torch.manual_seed(0)
    block = _Block()
    works, want = _works(block, k)
    batched_weight(works)
    for name, p in block.named_parameters():
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, want[name], rtol=1e-5, atol=1e-6)
    assert not any(w.pending for w in works)


def test_one_product_per_weight_and_the_shared_input_concatenated_once() -> None:
    """Three micro-batches: one by one, the four weight matrices take a product each per
    micro-batch (12); batched, one each (4). The concatenations: the shared input of the
    query, key and value once, the LayerNorm's output once, each product's gradient once
    (4): 6, not 8."""
    torch.manual_seed(0)
    block = _Block()
    works, _ = _works(block, 3)
    with OpCounts() as one_by_one:
        for w in works:
            backward_weight(w)
    works, _ = _works(block, 3)
    with OpCounts() as batched:
        batched_weight(works)
    products = ("mm", "addmm", "addmm_")
    assert sum(one_by_one.ops[o] for o in products) == 12
    assert sum(batched.ops[o] for o in products) == 4
    assert batched.ops["cat"] == 6
    # the LayerNorm's weights are not a matrix product: micro-batch by micro-batch
    assert batched.ops["native_layer_norm_backward"] == 3


def test_a_group_runs_at_its_last_w_on_the_rank() -> None:
    """ZB-H1 on 2 ranks, 4 micro-batches in groups of 2: each rank's W1 computes
    micro-batches 0 and 1, its W3 2 and 3, its W0 and W2 nothing."""
    plan = make_plan("zb-h1", 2, 4, weight_batch=2)
    groups = weight_groups(plan)
    for stage in (0, 1):
        got = {mb: groups[a] for a in plan.actions[stage] if a.kind == "W" for mb in [a.mb]}
        assert got == {0: (), 1: (0, 1), 2: (), 3: (2, 3)}
    deferred = Deferred(plan)
    w = [a for a in plan.actions[1] if a.kind == "W"]
    marks = [[WeightWork()] for _ in range(4)]
    assert deferred.take(w[0], marks[0]) == []
    assert deferred.take(w[1], marks[1]) == [marks[0], marks[1]]
    assert deferred.take(w[2], marks[2]) == []
    assert deferred.take(w[3], marks[3]) == [marks[2], marks[3]]
    assert not deferred.held


def test_three_micro_batches_in_groups_of_two_leave_the_last_alone() -> None:
    plan = make_plan("zb-h1", 2, 3, weight_batch=2)
    ws = {a.mb: g for a, g in weight_groups(plan).items() if a.stage == 1}
    assert ws == {0: (), 1: (0, 1), 2: (2,)}


def test_a_run_refuses_a_weight_batch_below_one() -> None:
    from pipecast.errors import ConfigError
    from pipecast.runtime.config import RunConfig

    assert RunConfig(weight_batch=1).weight_batch == 1
    with pytest.raises(ConfigError, match="a weight batch is at least 1 micro-batch, got 0"):
        RunConfig(weight_batch=0)


def test_a_weight_batch_groups_at_most_a_steps_micro_batches() -> None:
    """k = M is one group of the whole step; k = M + 1 would be a group the step never fills,
    refused as the plan is made (before any profile or rank)."""
    whole = make_plan("zb-h1", 2, 4, weight_batch=4)
    assert {g for a, g in weight_groups(whole).items() if a.stage == 0} == {(), (0, 1, 2, 3)}
    with pytest.raises(PlanError, match="weight batch of 5 is more than the 4 micro-batches "
                       "zb-h1 runs a step"):  # fmt: skip
        make_plan("zb-h1", 2, 4, weight_batch=5)
