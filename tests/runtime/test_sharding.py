"""How a stage's blocks are split and sharded (runtime/sharding.py), read from what torch
leaves behind on two gloo CPU ranks: the modules fully_shard made FSDP units, and the
collectives a split block runs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from tests.runtime.helpers import OpCounts
from torch import nn

from pipecast.measuring.profiler.tensor_parallel import reduces
from pipecast.runtime.launch import Context, spawn
from pipecast.runtime.sharding import apply, build_mesh, split_blocks
from pipecast.values.models import Workload
from pipecast.values.models.tensor_plans import FALLBACK_REDUCES
from pipecast.values.models.tensor_plans import GPT as GPT_PLAN
from pipecast.values.parallel import Layout
from pipecast.values.strategy import Shard

GPT = Workload(model="gpt", dataset="tokens", seq_len=8, vocab=64, width=32, layers=2, heads=4)
SHARDS: tuple[Shard, ...] = ("full", "grad")


def _on_rank(ctx: Context) -> dict[str, Any]:
    """On each of two ranks: a GPT stage sharded each way, its blocks and then the stage
    itself each with whether it is an FSDP unit; and the all-reduces one transformer block
    split over the two ranks runs in its forward and in its backward."""
    from torch.distributed.fsdp import FSDPModule

    mesh = build_mesh(ctx.device, Layout(replicas=2, pipeline=1), "full")  # once a process
    out: dict[str, Any] = {}
    for shard in SHARDS:
        torch.manual_seed(0)
        stage = GPT.build()
        apply(stage, replace(mesh, shard=shard))
        blocks: list[nn.Module] = [*stage, stage]
        out[shard] = [(type(b).__name__, isinstance(b, FSDPModule)) for b in blocks]
    torch.manual_seed(0)
    stage = GPT.build()
    split_blocks(stage, mesh.dp)  # the same two ranks, as a tensor-parallel group
    x = torch.randn(2, 8, 32, requires_grad=True)
    with OpCounts() as forward:
        y = stage[1](x)
    with OpCounts() as backward:
        y.sum().backward()
    out["reduces"] = (forward.ops["all_reduce"], backward.ops["all_reduce"])
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = spawn(_on_rank, 2, timeout_s=60)
    assert got[0] == got[1]
    return got


def test_every_block_with_weights_is_a_unit_of_its_own(ranks: list[dict[str, Any]]) -> None:
    """The embedding, each transformer block and the head are each gathered on their own
    (torchtitan's wrapping; the simulator prices one unit per block, planning/recommend/
    mesh.py), and the stage is the root unit over them: none of the blocks' weights is
    gathered with the root's."""
    for shard in SHARDS:
        names, units = zip(*ranks[0][shard], strict=True)
        assert len(names) == 5 and names[0].endswith("Embedding"), names
        assert all(units), (shard, names)


def test_a_split_gpt_block_all_reduces_twice_forward_and_four_times_back(
    ranks: list[dict[str, Any]],
) -> None:
    """torch's own count: the forward all-reduces the 2 row-wise projections' partial
    outputs, the backward each of the 4 column-wise ones' input gradients (q, k, v,
    MLP-in). The profiler reads the same from the plan, and a profile without that reading
    is priced at it."""
    assert tuple(ranks[0]["reduces"]) == reduces(GPT_PLAN) == FALLBACK_REDUCES == (2, 4)
