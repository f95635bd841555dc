"""How a stage's blocks become FSDP units (runtime/sharding.py), read from the modules
torch's fully_shard leaves behind, on two gloo CPU ranks."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from pipecast.runtime.launch import Context, spawn
from pipecast.runtime.layout import Layout
from pipecast.runtime.sharding import apply, build_mesh
from pipecast.values.models import Workload
from pipecast.values.strategy import Shard

GPT = Workload(model="gpt", dataset="tokens", seq_len=8, vocab=64, width=32, layers=2, heads=4)
SHARDS: tuple[Shard, ...] = ("full", "grad")


def _units(ctx: Context) -> dict[str, list[tuple[str, bool]]]:
    """A GPT stage sharded over the two ranks each way: its blocks, then the stage itself,
    each with whether it is an FSDP unit."""
    from torch.distributed.fsdp import FSDPModule

    mesh = build_mesh(ctx.device, Layout(replicas=2, width=1), "full")  # once a process
    out = {}
    for shard in SHARDS:
        torch.manual_seed(0)
        stage = GPT.build()
        apply(stage, replace(mesh, shard=shard))
        blocks: list[nn.Module] = [*stage, stage]
        out[shard] = [(type(b).__name__, isinstance(b, FSDPModule)) for b in blocks]
    return out


def test_every_block_with_weights_is_a_unit_of_its_own() -> None:
    """The embedding, each transformer block and the head are each gathered on their own
    (torchtitan's wrapping; the simulator prices one unit per block, planning/recommend/
    mesh.py), and the stage is the root unit over them: none of the blocks' weights is
    gathered with the root's."""
    ranks = spawn(_units, 2, timeout_s=60)
    assert ranks[0] == ranks[1]
    for shard in SHARDS:
        names, units = zip(*ranks[0][shard], strict=True)
        assert len(names) == 5 and names[0].endswith("Embedding"), names
        assert all(units), (shard, names)
