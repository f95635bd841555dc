"""A rank's stages, built from a job: the model's blocks, this rank's slices of them, each
on the device with its optimizer, and the parameters they share with other stages."""

from __future__ import annotations

import copy

import torch
from torch import nn

from pipecast.errors import ConfigError
from pipecast.runtime import ties
from pipecast.runtime.job import TrainJob
from pipecast.runtime.launch import Context
from pipecast.runtime.sharding import StageMesh
from pipecast.runtime.stage import StageModule, materialize
from pipecast.values.models.graph_blocks import GraphBlock
from pipecast.values.models.sources import library_of


def whole_model(job: TrainJob) -> nn.Sequential:
    """The whole model's blocks: shapes only (each stage initialises its own) unless the run
    asks for one process's weights or the blocks are captured (their parameters sit in
    graphs a meta build cannot re-initialise; a library's model always is)."""
    if job.model is not None:
        return job.model
    assert job.workload is not None
    if not job.exact_init and library_of(job.workload.model) is None:
        model = job.workload.build("meta")
        if not any(isinstance(b, GraphBlock) for b in model):
            return model
    torch.manual_seed(job.config.seed)
    return job.workload.build()


def _slices(
    job: TrainJob, ctx: Context, own: list[int], model: nn.Sequential
) -> dict[int, nn.Sequential]:
    """This rank's stages' blocks. Two stages here sharing a parameter get a copy each, so
    that each stage's optimizer steps its own (pipecast.runtime.ties keeps them equal)."""
    part = job.partition
    slices: dict[int, nn.Sequential] = {}
    for s in own:
        blocks = model[part.stages[s].start : part.stages[s].stop]
        assert isinstance(blocks, nn.Sequential)
        slices[s] = blocks
    sharing = [s for s, blocks in slices.items() if any(getattr(b, "tied", None) for b in blocks)]
    out = {}
    for s, blocks in slices.items():
        if len(sharing) > 1 and s in sharing:
            blocks = copy.deepcopy(blocks)
        if any(p.is_meta for p in blocks.parameters()):
            torch.manual_seed(job.config.seed + s)
            blocks = materialize(blocks, ctx.device)
            assert isinstance(blocks, nn.Sequential)
        out[s] = blocks
    return out


def build_stages(
    job: TrainJob, ctx: Context, pipeline_rank: int, replica: int, mesh: StageMesh | None = None
) -> tuple[dict[int, StageModule], list[ties.Tie]]:
    """This rank's StageModules and the ties among their parameters. Collective: every rank
    creates every tie's process groups; `mesh` splits and shards the blocks."""
    model = whole_model(job)
    tied = ties.holders(model)
    if tied and mesh is not None and (mesh.tp is not None or mesh.dp is not None):
        raise ConfigError(
            f"FSDP and tensor parallelism cannot keep tied parameters ({', '.join(sorted(tied))})"
            " equal across their shards: untie them or run without a mesh"
        )
    if tied and job.plan.async_updates:
        raise ConfigError(
            f"PipeDream's per-micro-batch updates cannot keep tied parameters "
            f"({', '.join(sorted(tied))}) equal across stages: use a synchronous schedule"
        )
    last = job.plan.num_stages - 1
    stages = {}
    for s, blocks in _slices(job, ctx, job.plan.stages_of(pipeline_rank), model).items():
        stages[s] = StageModule(
            s,
            blocks,
            ctx.device,
            job.config,
            first=s == 0,
            last=s == last,
            mesh=mesh,
            split=job.plan.split_backward and s > 0,
        )
        stages[s].start = job.partition.stages[s].start
        if job.plan.forward_only:  # inference: batch norm's running statistics, no dropout
            stages[s].module.eval()
    modules = {s: st.module for s, st in stages.items()}
    assert all(isinstance(m, nn.Sequential) for m in modules.values())
    found = ties.find_ties(
        tied, job.partition, job.plan, modules, replica=replica, replicas=job.replicas
    )
    return stages, found
