"""Run a job: spawn one process per device here, or join torchrun's group."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch.distributed as dist

from pipecast.errors import ConfigError
from pipecast.runtime import checkpoint, digests
from pipecast.runtime.job import TrainJob
from pipecast.runtime.launch import (
    Backend,
    Context,
    RankLost,
    run_distributed,
    spawn,
    under_torchrun,
)
from pipecast.runtime.stopping import Stopped, held
from pipecast.runtime.worker import RankReport, StepProgress, run_rank, summary
from pipecast.values.plan.action import Action, Plan
from pipecast.values.plan.grid import render_grid
from pipecast.values.timeline import Event, Timeline


@dataclass
class JobResult:
    job: TrainJob
    reports: list[RankReport]

    @property
    def summary(self) -> dict[str, Any]:
        return summary(self.reports, self.job.batch)

    def timeline(self) -> Timeline:
        """The measured last step of replica 0, as a Timeline (for traces and comparison)."""
        width = self.job.plan.num_ranks
        events: list[Event] = []
        for r in self.reports:
            if r.replica == 0:
                events += [
                    Event(r.pipeline_rank, e.name, e.kind, e.start, e.end, e.stage, e.mb)
                    for e in r.events
                ]
        busy = [0.0] * width
        for e in events:
            busy[e.rank] += e.duration
        span = max((e.end for e in events), default=0.0) - min(
            (e.start for e in events), default=0.0
        )
        return Timeline(
            plan=self.job.plan.name,
            step_time=self.summary["step_time"],
            events=tuple(sorted(events, key=lambda e: (e.rank, e.start))),
            busy=tuple(busy),
            compute_span=span,
            peak_memory=tuple(self.summary["peak_allocated"][:width]),
        )


def agreed(ctx: Context, job: TrainJob) -> TrainJob:
    """`job` with rank 0's partition and plan. Under torchrun every rank builds its job
    itself, and an automatic partition rests on that rank's own quick profile, which timing
    noise can tip to other boundaries: ranks running different splits would exchange
    tensors of the wrong shapes or wait forever."""
    mine: list[Any] = [job.partition, job.plan]
    dist.broadcast_object_list(mine, src=0)
    return replace(job, partition=mine[0], plan=mine[1])


def same_checkpoint(ctx: Context, job: TrainJob) -> None:
    """Every rank resumes from the same checkpoint, or none does: each checks the files
    itself (under torchrun, on its own node's view of the shared directory), and a rank
    that found another checkpoint intact than rank 0 did would load other weights."""
    saved = job.resume_from()
    mine = str(saved.path) if saved is not None else "none (from scratch)"
    if not (dist.is_initialized() and ctx.world > 1):
        return
    chosen: list[Any] = [None] * ctx.world
    dist.all_gather_object(chosen, mine)
    if any(c != chosen[0] for c in chosen):
        other = next(r for r, c in enumerate(chosen) if c != chosen[0])
        raise ConfigError(
            f"ranks disagree on the checkpoint to resume from: rank 0 {chosen[0]}, rank "
            f"{other} {chosen[other]} (did the files change, or do nodes see other files?)"
        )


def _gathered(ctx: Context, job: TrainJob) -> list[RankReport] | None:
    job = agreed(ctx, job)
    same_checkpoint(ctx, job)
    report = run_rank(ctx, job)
    reports: list[Any] = [None] * ctx.world
    dist.gather_object(report, reports if ctx.rank == 0 else None, dst=0)
    return reports if ctx.rank == 0 else None


def _local_rank(ctx: Context, job: TrainJob, checked: Mapping[digests.Key, str]) -> RankReport:
    """A rank started here: it takes the checkpoint files the launcher checked as checked."""
    digests.trust(checked)
    same_checkpoint(ctx, job)
    return run_rank(ctx, job)


def where_each_rank_was(lost: RankLost, plan: Plan, ranks: range | list[int]) -> RankLost:
    """`lost` with a line for each of `ranks`, saying what it was doing, and the plan's grid
    with the action each was on marked (replica 0's, where several replicas report)."""
    lines = []
    marks: dict[int, Action] = {}
    for rank in ranks:
        at = lost.where.get(rank)
        if at is None:
            lines.append(f"  rank {rank}: no word from it")
            continue
        on = f" (on {at.action})" if at.action is not None else ""
        lines.append(f"  rank {rank} (pipeline rank {at.pipeline_rank}): {at.what}{on}")
        if at.action is not None:
            marks.setdefault(at.pipeline_rank, at.action)
    text = "\n".join(
        [str(lost), "where each rank was (the action it was on in [brackets]):", *lines]
    )
    return RankLost(f"{text}\n{render_grid(plan, marks=marks)}", lost.where)


def _tell_passed_over(job: TrainJob) -> None:
    """Name each newer checkpoint that a resume passes over, and why (rank 0 only); where it
    passes over every step there is (incomplete ones, files named like one), say that it
    starts from scratch."""
    saved = job.resume_from()
    cp = job.checkpoint
    if cp is None or not cp.resume or os.environ.get("RANK", "0") != "0":
        return
    if saved is not None:
        lines, then = saved.passed_over, f"resuming from the newest intact one, {saved.path}"
    else:
        lines, then = checkpoint.survey(cp.dir)[1], "no intact checkpoint: starting from scratch"
    for line in lines:
        print(f"pipecast: {line}; {then}", file=sys.stderr, flush=True)


def _spawned(
    job: TrainJob,
    backend: Backend,
    timeout: float,
    progress: Callable[[StepProgress], None] | None,
) -> list[RankReport]:
    """Every rank's report, from ranks spawned here. Stopped (a signal, Ctrl-C): the ranks
    are ended by then (spawn), so nothing writes the checkpoints any more, and the step one
    was writing, incomplete, goes: what stays is complete."""
    try:
        reports: list[RankReport] = spawn(
            _local_rank,
            job.world,
            (job, digests.known()),
            backend=backend,
            timeout_s=timeout,
            grace_s=job.config.timeout_s + 10,
            progress=progress,
        )
    except (KeyboardInterrupt, Stopped):
        if job.checkpoint is not None:
            with held():
                checkpoint.discard_incomplete(job.checkpoint.dir)
        raise
    return reports


def run_job(
    job: TrainJob, progress: Callable[[StepProgress], None] | None = None
) -> JobResult | None:
    """Run `job`. Locally: spawn `job.world` processes and return every rank's report. Under
    torchrun: run this rank; rank 0 returns everyone's reports, other ranks None.
    `progress` hears after every step how far the run has got (locally only). A rank lost
    (it died, or made no progress within the timeout): RankLost, saying where each was."""
    job.check()
    _tell_passed_over(job)
    backend: Backend = "nccl" if job.device == "cuda" else "gloo"
    timeout = job.config.timeout_s + 60
    try:
        if under_torchrun():
            gathered = run_distributed(_gathered, (job,), backend=backend, timeout_s=timeout)
            return JobResult(job, gathered) if gathered is not None else None
        reports = _spawned(job, backend, timeout, progress)
    except RankLost as lost:  # under torchrun a rank knows only where it was itself
        ranks = sorted(lost.where) if under_torchrun() else range(job.world)
        raise where_each_rank_was(lost, job.plan, ranks) from None
    return JobResult(job, reports)
