"""What each system runs for one configuration, on every rank of the world: pipecast's
runtime, the baselines it ships (one device, DDP, torch.distributed.pipelining) and systems
the suite runner is given by name."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from pipecast.errors import PipecastError
from pipecast.orchestration.bench import baselines
from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.timing import (
    action_stats,
    gather_events,
    gather_floats,
    gather_peaks,
)
from pipecast.planning.partition.boundaries import placement_of
from pipecast.planning.schedules.generators import make_plan
from pipecast.runtime.config import RunConfig
from pipecast.runtime.job import TrainJob
from pipecast.runtime.launch import Context
from pipecast.runtime.worker import run_rank
from pipecast.values.partition import from_boundaries


def pipecast_job(cfg: BenchConfig, *, capture: bool = False) -> TrainJob:
    stages = cfg.stages
    bounds = list(cfg.boundaries) or None
    if bounds is None:
        raise PipecastError(f"{cfg.label()}: pipecast configurations need boundaries")
    # interleaved: as many virtual stages per rank as the boundaries give it
    virtual = (len(bounds) - 1) // stages if cfg.schedule == "interleaved" else 0
    plan = make_plan(
        cfg.schedule if cfg.stages > 1 else "1f1b", stages, cfg.microbatches, virtual=virtual
    )
    part = from_boundaries(
        bounds,
        placement=placement_of(cfg.schedule),
        ranks=stages,
        replicas=cfg.replicas,
    )
    return TrainJob(
        plan=plan,
        partition=part,
        batch=cfg.batch,
        workload=cfg.workload,
        replicas=cfg.replicas,
        config=RunConfig(
            dtype=cfg.dtype,
            recompute=cfg.recompute,
            offload=cfg.offload,
            optimizer="adam" if cfg.accuracy_steps else cfg.optimizer,
            lr=3e-3 if cfg.accuracy_steps else 1e-4,
            record_events=cfg.device == "cuda",
            send_timing=cfg.send_timing,
            cut_backward=cfg.cut_backward,
            cuda_graphs=cfg.cuda_graphs,
            timeout_s=120,
        ),
        device="cuda" if cfg.device == "cuda" else "cpu",
        steps=cfg.accuracy_steps or cfg.steps,
        warmup_steps=0 if cfg.accuracy_steps else cfg.warmup,
        exact_init=cfg.device != "cuda" or bool(cfg.accuracy_steps),
        capture=capture,
    )


def _run_pipecast(ctx: Context, cfg: BenchConfig) -> dict[str, Any]:
    job = pipecast_job(cfg, capture=bool(cfg.accuracy_steps))
    report = run_rank(ctx, job)
    times = sorted(s.seconds for s in report.steps)
    result: dict[str, Any] = {
        "step_time": times[len(times) // 2],
        "step_times": [s.seconds for s in report.steps],
        "peak_allocated": max((s.peak_allocated for s in report.steps), default=0),
        "peak_reserved": max((s.peak_reserved for s in report.steps), default=0),
    }
    result = gather_peaks(result, ctx.device)
    result["actions"] = gather_floats(action_stats(report.steps, report.events), ctx.device)
    if job.config.record_events:  # the last step's actions, to set beside the prediction's
        result["timeline"] = gather_events(report.events)
    if cfg.accuracy_steps:
        result["top1_error"] = _top1_error(ctx, cfg, report.params if report.replica == 0 else {})
    return result


def _top1_error(ctx: Context, cfg: BenchConfig, params: dict[str, torch.Tensor]) -> float | None:
    from pipecast.values.data.digits import load_digits_as_mnist

    gathered: list[Any] = [None] * ctx.world
    dist.gather_object(
        params, gathered if ctx.rank == 0 else None, dst=0
    ) if ctx.world > 1 else None
    if ctx.rank != 0:
        return None
    merged: dict[str, torch.Tensor] = {}
    for part in gathered if ctx.world > 1 else [params]:
        merged.update(part or {})
    model = cfg.workload.build()
    model.load_state_dict(merged)
    _, test = load_digits_as_mnist().split(0.8, seed=0)
    with torch.no_grad():
        correct = float((model(test.inputs).argmax(1) == test.targets).float().mean().item())
    return 1.0 - correct


SystemRun = Callable[[Context, BenchConfig], dict[str, Any]]
"""A system's measurement of one configuration on one rank (every rank calls it)."""


def run_config(
    ctx: Context, cfg: BenchConfig, systems: Mapping[str, SystemRun] | None = None
) -> dict[str, Any]:
    """Measure one configuration on this rank (every rank of the world calls this)."""
    systems = systems or {}
    if cfg.system == "pipecast":
        return _run_pipecast(ctx, cfg)
    if cfg.system == "single":
        return baselines.single_device(
            ctx,
            cfg.workload,
            cfg.batch,
            microbatches=cfg.microbatches,
            dtype=cfg.dtype,
            steps=cfg.steps,
            warmup=cfg.warmup,
        )
    if cfg.system == "ddp":
        return baselines.ddp(
            ctx, cfg.workload, cfg.batch, dtype=cfg.dtype, steps=cfg.steps, warmup=cfg.warmup
        )
    if cfg.system in systems:
        return systems[cfg.system](ctx, cfg)
    if cfg.system != "torch":
        raise PipecastError(f"{cfg.label()}: no system named {cfg.system!r} in this run")
    return baselines.torch_pipelining(
        ctx,
        cfg.workload,
        cfg.batch,
        list(cfg.boundaries),
        schedule=cfg.schedule,
        microbatches=cfg.microbatches,
        dtype=cfg.dtype,
        steps=cfg.steps,
        warmup=cfg.warmup,
    )
