"""A single-process reference the pipeline must match, and job plumbing for tests."""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from pipecast.planning.partition import from_boundaries
from pipecast.planning.schedules import make_plan
from pipecast.planning.schedules.generators import stages_per_rank
from pipecast.runtime.config import RunConfig
from pipecast.runtime.job import TrainJob
from pipecast.runtime.launch import Backend, Context, spawn
from pipecast.runtime.run import JobResult, run_job
from pipecast.runtime.worker import RankReport, run_rank
from pipecast.values.data.loss import loss_for
from pipecast.values.data.synthetic import synthetic_batch
from pipecast.values.models import Workload
from pipecast.values.plan.weight_groups import weight_groups

PLACEMENT = {"interleaved": "loop", "zb-v": "v"}


def reference_step(
    model: nn.Sequential,
    workload: Workload,
    batch: int,
    *,
    seed: int = 0,
    lr: float = 0.1,
    steps: int = 1,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Full-batch SGD steps on the runtime's batches (seed + step): (parameters after the
    last, gradients of the last)."""
    grads: dict[str, torch.Tensor] = {}
    for step in range(steps):
        model.zero_grad(set_to_none=True)
        x, y = synthetic_batch(workload.spec, batch, seed=seed + step)
        loss = loss_for(workload.spec)(model(x), y)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= lr * p.grad
    return {n: p.detach().clone() for n, p in model.named_parameters()}, grads


def pipeline_job(
    workload: Workload,
    schedule: str,
    ranks: int,
    microbatches: int,
    boundaries: list[int],
    *,
    batch: int = 8,
    replicas: int = 1,
    config: RunConfig | None = None,
    steps: int = 1,
    model: nn.Sequential | None = None,
    capture: bool = True,
    device: str = "cpu",
    weight_batch: int = 1,
    virtual: int = 0,
) -> TrainJob:
    plan = make_plan(schedule, ranks, microbatches, virtual=virtual, weight_batch=weight_batch)
    assert len(boundaries) - 1 == ranks * stages_per_rank(schedule, virtual)
    part = from_boundaries(
        boundaries,
        placement=PLACEMENT.get(schedule, "one"),  # type: ignore[arg-type]
        ranks=ranks,
        replicas=replicas,
    )
    return TrainJob(
        plan=plan,
        partition=part,
        batch=batch,
        workload=None if model else workload,
        model=model,
        dataset=workload.dataset,
        replicas=replicas,
        config=config or RunConfig(lr=0.1, timeout_s=60),
        steps=steps,
        warmup_steps=0,
        capture=capture,
        device=device,  # type: ignore[arg-type]
    )


def run(job: TrainJob) -> JobResult:
    result = run_job(job)
    assert result is not None
    return result


def merged(result: JobResult, what: str) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for r in result.reports:
        if r.replica == 0:
            out.update(getattr(r, what))
    return out


def assert_close(
    got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], rtol: float = 1e-5
) -> None:
    assert set(got) == set(want), set(got) ^ set(want)
    for name, ref in want.items():
        scale = ref.abs().max().item() + 1e-12
        err = (got[name] - ref).abs().max().item() / scale
        assert err < rtol, f"{name}: relative error {err:.2e}"


def _run_jobs(ctx: Context, jobs: list[TrainJob]) -> list[RankReport]:
    return [run_rank(ctx, job) for job in jobs]


def run_all(jobs: list[TrainJob], env: dict[str, str] | None = None) -> list[JobResult]:
    """Run `jobs` one after another in one spawned world per world size and device (gloo on
    CPU ranks, NCCL on GPUs), sharing its start (each job builds its own stages, seeds and
    batches, as in a world of its own); `env` is set for the ranks."""
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        out: dict[int, JobResult] = {}
        for world, device in sorted({(j.world, j.device) for j in jobs}):
            mine = [(i, j) for i, j in enumerate(jobs) if (j.world, j.device) == (world, device)]
            for job in (j for _, j in mine):
                job.check()
            backend: Backend = "nccl" if device == "cuda" else "gloo"
            per_rank = spawn(
                _run_jobs, world, ([j for _, j in mine],), backend=backend, timeout_s=120
            )
            for n, (i, job) in enumerate(mine):
                out[i] = JobResult(job, [rank[n] for rank in per_rank])
        return [out[i] for i in range(len(jobs))]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def weightless_first() -> nn.Sequential:
    """A model for MNIST whose first block (a flatten) has no weights: a first stage of it
    alone has no backward to compute."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 32), nn.Tanh(), nn.Linear(32, 10))


def graphs_per_step(result: JobResult, weightless_first: bool = False) -> dict[int, int]:
    """Graphs each pipeline rank replays in a graphed step: one per action, but the first
    stage's W (its B is its whole backward) and, where it has no weights, its backward; and
    under a weight batch, one W per group of micro-batches."""
    plan = result.job.plan
    idle = ("W", "B", "BW") if weightless_first else ("W",)
    groups = weight_groups(plan)
    return {
        rank: sum(
            1
            for a in actions
            if not (a.stage == 0 and a.kind in idle) and not (a.kind == "W" and not groups[a])
        )
        for rank, actions in enumerate(plan.actions)
    }


def assert_replayed(result: JobResult, weightless_first: bool = False) -> None:
    """The first step ran eagerly and captured; every later one replayed every graph."""
    want = graphs_per_step(result, weightless_first)
    for r in result.reports:
        assert r.graphs_captured == want[r.pipeline_rank], r.global_rank
        replayed = [s.graphs_replayed for s in r.steps]
        assert replayed == [0] + [want[r.pipeline_rank]] * (len(replayed) - 1), r.global_rank


def fault(rank: int, step: int, how: str, at_rank: int, at_step: int) -> None:
    """A TrainJob.before_step hook (bound with functools.partial): at `rank`'s `step`, end
    the process as a kill would (no report) or, with how="hang", block there."""
    if (at_rank, at_step) != (rank, step):
        return
    if how == "hang":
        time.sleep(10**6)
    os._exit(9)


class OpCounts(TorchDispatchMode):
    """Counts the ATen ops torch runs inside it, by name (`ops`): a mm, an all_reduce."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))
