"""A stage's blocks on torch's own engines: split over the tensor-parallel ranks by
parallelize_module, sharded over the data-parallel replicas by FSDP (fully_shard).

The job's ranks form one device mesh, outermost first: data-parallel replica, pipeline rank,
tensor-parallel rank (values/parallel.py numbers them the same way). A stage splits each
planned block (values/models/tensor_plans.py) over its "tp" sub-mesh, then shards every
block with weights as a unit of its own over its "dp" sub-mesh, and the stage as the root
unit: as torchtitan applies them, tensor parallelism first.

FSDP inside a pipeline: a stage's backward runs once per micro-batch, and its weights and
gradients would be gathered and reduce-scattered each time. The engine tells the stage
which backward is its step's last (sync_at): only that one reduce-scatters and reshards, so
the units stay gathered in between (as torch.distributed.pipelining runs FSDP stages). This
is also what makes a split backward correct: a B that resharded would leave W with weights
outside the graph, and nothing to reduce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pipecast.errors import ConfigError
from pipecast.runtime.recompute import checkpoint_blocks
from pipecast.values.models.tensor_plans import local_shapes, plan_of
from pipecast.values.parallel import Layout
from pipecast.values.strategy import Shard


@dataclass(frozen=True)
class StageMesh:
    """How this rank's stages split and shard their blocks."""

    tp: Any | None = None
    """The tensor-parallel sub-mesh (torch DeviceMesh); None: blocks whole."""
    dp: Any | None = None
    """The data-parallel sub-mesh FSDP shards over; None: replicas hold whole copies."""
    shard: Shard = "none"
    within_pipeline: bool = False
    """The stage is one of several: its FSDP units sync only at the step's last backward."""


def build_mesh(device: torch.device, layout: Layout, shard: Shard) -> StageMesh:
    """The job's device mesh and this rank's sub-meshes. Collective: every rank calls it."""
    if layout.tensor == 1 and (shard == "none" or layout.replicas == 1):
        return StageMesh()
    if layout.context != 1:
        raise ConfigError(
            f"context parallelism (degree {layout.context}) does not run yet: use degree 1"
        )
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(
        device.type,
        (layout.replicas, layout.pipeline, layout.tensor),
        mesh_dim_names=("dp", "pp", "tp"),
    )
    sharded = shard != "none" and layout.replicas > 1
    return StageMesh(
        tp=mesh["tp"] if layout.tensor > 1 else None,
        dp=mesh["dp"] if sharded else None,
        shard=shard if sharded else "none",
        within_pipeline=layout.pipeline > 1,
    )


def split_blocks(blocks: nn.Sequential, tp_mesh: Any) -> None:
    """Each planned block's projections split column- or row-wise over `tp_mesh`, a captured
    block's shape literals made one rank's first (tensor_plans.local_shapes)."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        ParallelStyle,
        RowwiseParallel,
        parallelize_module,
    )

    for block in blocks:
        plan = plan_of(block)
        if plan is None:
            continue
        styles: dict[str, ParallelStyle] = {
            name: ColwiseParallel() if split == "colwise" else RowwiseParallel()
            for name, split in plan.items()
        }
        local_shapes(block, plan, tp_mesh.size())
        parallelize_module(block, tp_mesh, styles)


def shard_blocks(module: nn.Sequential, mesh: StageMesh) -> None:
    """Every block with weights a unit of its own, and `module` the root unit, sharded over
    the data-parallel sub-mesh. 'grad' keeps each unit gathered from its forward to its
    backward; the stage's last unit always is, its backward coming right after its forward;
    within a pipeline only 'grad' runs (TrainJob.check)."""
    from torch.distributed.fsdp import fully_shard

    keep = mesh.shard == "grad"
    owners = [b for b in module if any(p.requires_grad for p in b.parameters())]
    for i, block in enumerate(owners):
        last = i == len(owners) - 1
        fully_shard(block, mesh=mesh.dp, reshard_after_forward=not (keep or last))
    fully_shard(module, mesh=mesh.dp, reshard_after_forward=not keep)


def apply(module: nn.Sequential, mesh: StageMesh, recompute: str = "none") -> None:
    """`module`'s blocks split and sharded as `mesh` says (nothing for an empty mesh); a
    sharded stage that recomputes (`recompute`) makes each block a checkpoint of its own
    between the two, as torchtitan does (pipecast.runtime.recompute)."""
    if mesh.tp is not None:
        split_blocks(module, mesh.tp)
    if mesh.dp is not None:
        if recompute != "none":
            checkpoint_blocks(module, recompute)
        shard_blocks(module, mesh)


def sync_at(module: nn.Module, last: bool) -> None:
    """Before a backward within a pipeline: only the step's `last` reduce-scatters the
    gradients and reshards the weights (module docstring)."""
    fsdp = getattr(module, "set_requires_gradient_sync", None)
    if fsdp is None:
        return
    module.set_requires_gradient_sync(last)  # type: ignore[operator]
    module.set_reshard_after_backward(last)  # type: ignore[operator]
    module.set_is_last_backward(last)  # type: ignore[operator]


def full(tensor: torch.Tensor) -> torch.Tensor:
    """A parameter or gradient whole: a DTensor gathered from its shards (collective over
    its mesh), a plain tensor as it is."""
    whole = getattr(tensor, "full_tensor", None)
    return whole() if callable(whole) else tensor


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (a plain tensor as it is)."""
    mine = getattr(tensor, "to_local", None)
    return mine() if callable(mine) else tensor
