"""Cutting a stage into separate autograd graphs for the split backward: the rule the
runtime and the profile share, and gradients equal to one whole backward."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipecast.runtime.backward import (
    Cut,
    _children,
    backward_full,
    backward_input,
    backward_input_segments,
    backward_weight,
    backward_weights,
)
from pipecast.runtime.config import RunConfig
from pipecast.runtime.stage import StageModule
from pipecast.values.profile.segments import segments


def test_a_segment_closes_at_the_limit_and_trailing_blocks_join_the_last() -> None:
    assert segments([]) == [(0, 0)]
    assert segments([0, 0]) == [(0, 2)]
    assert segments([2, 0, 2, 0, 2, 2, 0, 2]) == [(0, 8)]  # 10 tensors, one cut too few
    assert segments([12, 12, 12]) == [(0, 1), (1, 2), (2, 3)]
    assert segments([2, 0, 8, 0, 8, 0, 2]) == [(0, 3), (3, 7)]
    assert segments([2, 2, 2, 2, 2, 2, 2, 2, 0]) == [(0, 4), (4, 9)]
    assert segments([3, 3], limit=3) == [(0, 1), (1, 2)]
    with pytest.raises(ValueError, match="at least 1"):
        segments([1], limit=0)


def _deep(width: int) -> nn.Sequential:
    """Four linears (8 weight tensors): a segment of its own."""
    layers = [m for _ in range(3) for m in (nn.Linear(width, width), nn.Tanh())]
    return nn.Sequential(*layers, nn.Linear(width, width))


def _stage_blocks() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        _deep(6), nn.ReLU(inplace=True), _deep(6), nn.Identity(), nn.Linear(6, 3)
    ).double()


def test_a_cut_moves_past_a_block_that_begins_in_place() -> None:
    """The rule cuts before block 1, a ReLU(inplace=True) that no leaf can feed: the cut
    moves to block 2; the trailing Identity and Linear join the last segment."""
    stage = StageModule(
        0, _stage_blocks(), torch.device("cpu"), RunConfig(), first=False, last=False
    )
    assert [len(part) for part in stage.parts] == [2, 3]  # type: ignore[arg-type]
    assert [len(ps) for ps in stage.part_params] == [8, 10]


@pytest.mark.parametrize("nest", [False, True])
@pytest.mark.parametrize("recompute", [False, True])
def test_a_cut_stage_gives_the_gradients_of_one_whole_backward(recompute: bool, nest: bool) -> None:
    """Also with W issued from inside one outer backward, as a GPU issues it (`nest`)."""
    x = torch.randn(5, 6, dtype=torch.float64)
    g = torch.randn(5, 3, dtype=torch.float64)
    ref = _stage_blocks()
    leaf = x.detach().requires_grad_()
    grad_in_ref = backward_full(ref(leaf), g, leaf, list(ref.parameters()))
    stage = StageModule(
        0, _stage_blocks(), torch.device("cpu"), RunConfig(), first=False, last=False
    )
    works = []
    for _ in range(2):  # two micro-batches, all B before any W, as zero-bubble runs them
        leaf = x.detach().requires_grad_()
        out, cuts = stage.forward_cut(leaf, recompute=recompute)
        assert len(cuts) == 1 and isinstance(cuts[0], Cut)
        grad_in, ws = backward_input_segments(out, g, leaf, cuts, stage.part_params)
        assert grad_in is not None and torch.allclose(grad_in, grad_in_ref)
        assert all(p.grad is None for p in stage.params), "B must not touch weight gradients"
        works += ws
    backward_weights(works, torch.device("cpu"), nest=nest)
    for p, r in zip(stage.params, ref.parameters(), strict=True):
        assert r.grad is not None and p.grad is not None
        assert torch.allclose(p.grad, 2 * r.grad)


def test_segments_must_match_their_weights() -> None:
    x = torch.randn(2, 3, requires_grad=True)
    with pytest.raises(ValueError, match="2 segments but 1"):
        backward_input_segments(x * 2, None, x, [Cut(output=x, leaf=x)], [[]])


def _reach(layers: int, cut: bool) -> int:
    """The most autograd nodes any W entry point of a stage of `layers` encoder layers can
    reach: what the engine walks before that W call runs anything."""
    torch.manual_seed(0)
    blocks = nn.Sequential(
        *(
            nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers)
        )
    )
    stage = StageModule(0, blocks, torch.device("cpu"), RunConfig(), first=False, last=False)
    leaf = torch.randn(1, 2, 8).requires_grad_()
    if cut:
        out, cuts = stage.forward_cut(leaf)
        _, works = backward_input_segments(out, None, leaf, cuts, stage.part_params)
    else:
        works = [backward_input(stage.forward(leaf), None, leaf, stage.params)[1]]
    return max(len(_children(node)) for w in works for node, _, _ in w.captured)


def test_a_w_call_walks_only_its_own_segment() -> None:
    """Over one graph for the whole stage the top W entry reaches every layer below it, so
    W's host cost grows with the square of the depth (2.2-2.4x on 4 x H100 for 12 GPT-style
    layers); cut per layer, no entry reaches beyond its layer."""
    assert _reach(6, cut=False) > 5 * _reach(1, cut=False)
    assert _reach(6, cut=True) == _reach(1, cut=False)


class _ReluInPlace(nn.Module):
    """An in-place op that needs_input_copy cannot see (no `inplace` attribute)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu_(x)


def test_a_hidden_in_place_op_at_a_cut_stops_the_cutting() -> None:
    torch.manual_seed(0)
    blocks = nn.Sequential(_deep(6), _ReluInPlace(), nn.Linear(6, 6), _deep(6)).double()
    stage = StageModule(0, blocks, torch.device("cpu"), RunConfig(), first=False, last=False)
    assert len(stage.parts) == 2  # the rule cuts before the hidden in-place op
    x = torch.randn(3, 6, dtype=torch.float64)
    leaf = x.detach().requires_grad_()
    out, cuts = stage.forward_cut(leaf)
    assert cuts == [] and len(stage.parts) == 1
    g = torch.ones_like(out)
    grad_in, works = backward_input_segments(out, g, leaf, cuts, stage.part_params)
    for work in works:
        backward_weight(work)
    ref_leaf = x.detach().requires_grad_()
    ref = backward_full(blocks(ref_leaf), g, ref_leaf, [])
    assert grad_in is not None and ref is not None and torch.allclose(grad_in, ref)
