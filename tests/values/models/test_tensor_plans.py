"""Tensor parallelism's plan for a captured Hugging Face Llama (values/models/tensor_plans.py,
graph_linears.py, graph_split.py): the parts it finds, one rank's graph, what it refuses.

The reference is the whole block: t copies of it, each holding one rank's rows of the
column-wise projections and columns of the row-wise ones (as ColwiseParallel and
RowwiseParallel shard them), compute shares that sum to it."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from torch import nn

from pipecast.values.models import Workload
from pipecast.values.models.capture import capture
from pipecast.values.models.tensor_plans import (
    Plan,
    heads_of,
    local_shapes,
    plan_of,
    split_of,
    why_not_split,
)

LLAMA = Workload(model="tests.user_models:small_llama", dataset="tokens", seq_len=8, vocab=64)
LAYER = "body.model.model.layers.0"


@pytest.fixture(scope="module")
def blocks() -> nn.Sequential:
    torch.manual_seed(0)
    return LLAMA.build()


def test_a_decoder_layer_is_planned_as_its_attention_and_its_mlp(blocks: nn.Sequential) -> None:
    """Capture cuts each of the 2 layers into its attention and MLP halves, between the
    embedding and the final norm and head; each half holds one part of Llama's plan as
    nn.Linear modules under the model's own paths, the attention 4 query and 2 key/value
    heads."""
    plans = [plan_of(b) for b in blocks]
    assert [p is not None for p in plans] == [False, True, True, True, True, False, False]
    assert plans[1] == {
        f"{LAYER}.self_attn.q_proj": "colwise",
        f"{LAYER}.self_attn.k_proj": "colwise",
        f"{LAYER}.self_attn.v_proj": "colwise",
        f"{LAYER}.self_attn.o_proj": "rowwise",
    }
    assert plans[2] == {
        f"{LAYER}.mlp.gate_proj": "colwise",
        f"{LAYER}.mlp.up_proj": "colwise",
        f"{LAYER}.mlp.down_proj": "rowwise",
    }
    attention, plan = blocks[1], plans[1]
    assert plan is not None
    assert heads_of(attention, plan, split_of(attention, plan)) == (4, 2)


def _rank(block: nn.Module, plan: Plan, degree: int, rank: int) -> nn.Module:
    """A copy of `block` with `rank`'s share of each planned projection, its graph's shape
    literals made one rank's."""
    local = copy.deepcopy(block)
    for name, split in plan.items():
        owner, _, attr = name.rpartition(".")
        whole = local.get_submodule(name)
        assert isinstance(whole, nn.Linear) and whole.bias is None
        rows = whole.weight.detach().chunk(degree, dim=0 if split == "colwise" else 1)[rank]
        share = nn.Linear(rows.shape[1], rows.shape[0], bias=False)
        share.weight = nn.Parameter(rows.clone())
        setattr(local.get_submodule(owner), attr, share)
    local_shapes(local, plan, degree)
    return local


def test_ranks_shares_of_a_block_sum_to_the_block(blocks: nn.Sequential) -> None:
    """2 ranks of grouped-query attention hold 2 query heads and 1 key/value head each
    (repeat_kv's literals made one rank's); each rank's block adds the residual to its
    share of the attention (or MLP) output, so the shares sum to the block plus the
    residual once more."""
    torch.manual_seed(1)
    x = torch.randn(3, 8, 32)  # batch 3: not the capture's example
    for block in blocks[1:3]:
        plan = plan_of(block)
        assert plan is not None
        shares = [_rank(block, plan, 2, r)(x) for r in range(2)]
        torch.testing.assert_close(shares[0] + shares[1] - x, block(x), rtol=1e-5, atol=1e-6)


def test_what_ranks_cannot_share_is_refused_in_one_line(blocks: nn.Sequential) -> None:
    assert why_not_split(list(blocks), 2) is None
    assert why_not_split(list(blocks), 4) == (
        "block 1 has 2 key/value heads (grouped-query attention, 4 query heads), which 4 "
        "ranks cannot share: use a tensor-parallel degree that divides 2"
    )
    assert why_not_split(list(blocks), 8) == (
        "block 1 has 4 attention heads, which 8 ranks cannot share: use a tensor-parallel "
        "degree that divides them"
    )


def test_gpt2s_conv1d_is_named_when_captured() -> None:
    gpt2 = Workload(model="hf:gpt2", dataset="tokens", seq_len=8, vocab=64, width=32, layers=1)
    why = why_not_split(list(gpt2.build("meta")), 2)
    assert why is not None and why.startswith("GPT-2's projections are transformers' Conv1D")


class _HeadMixing(nn.Module):
    """Llama's projection names, but a softmax across the heads: no rank can compute its
    own heads alone."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            nn.Linear(16, 16, bias=False) for _ in range(4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, 4, 4) for p in (self.q_proj, self.k_proj, self.v_proj))
        mixed = (q * k).softmax(dim=2) * v  # (B, T, heads, head size), softmax over heads
        out: torch.Tensor = self.o_proj(mixed.reshape(b, t, 16))
        return out


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = _HeadMixing()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = h + self.self_attn(h)
        return out


class _Mixer(nn.Module):
    """Enough layers (8) that capture cuts between them, each layer a block."""

    def __init__(self, vocab: int, layers: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 16)
        self.layers = nn.ModuleList(_Layer() for _ in range(layers))
        self.head = nn.Linear(16, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        out: torch.Tensor = self.head(h)
        return out


def test_a_graph_the_split_cannot_follow_is_refused_naming_the_operation() -> None:
    spec = LLAMA.spec
    blocks = capture(_Mixer(spec.num_classes), spec, name="mixer")
    assert [plan_of(b) is not None for b in blocks] == [False, *[True] * 8, False]
    why = why_not_split(list(blocks), 2)
    assert why is not None
    assert re.fullmatch(
        r"block 1 cannot be split by its projections: \w+ \(aten\._?softmax\.\w+\) works "
        r"along the split heads or features",
        why,
    ), why


def test_attention_cut_apart_by_the_capture_is_refused_naming_the_cut() -> None:
    """One layer: too few blocks between layers, so capture cuts inside the attention and no
    block holds all of its projections."""
    spec = LLAMA.spec
    blocks = capture(_Mixer(spec.num_classes, layers=1), spec, name="mixer")
    assert all(plan_of(b) is None for b in blocks)
    assert why_not_split(list(blocks), 2) == (
        "the capture cut layers.0.self_attn's projections into different blocks (block 1 "
        "holds self_attn.q_proj, not self_attn.k_proj): tensor parallelism needs each "
        "attention and MLP whole in one block; use more layers (capture then cuts between "
        "them) or a factory that returns an nn.Sequential of whole blocks"
    )
