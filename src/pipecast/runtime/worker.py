"""What each rank runs: build its stages, feed data, time steps, report."""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from pipecast.errors import PipecastError
from pipecast.runtime import checkpoint, compiled, context, devices, sharding
from pipecast.runtime.devices import DTYPES
from pipecast.runtime.engine import PipelineEngine
from pipecast.runtime.job import TrainJob
from pipecast.runtime.launch import Context, write_progress
from pipecast.runtime.peer_loss import how_lost
from pipecast.runtime.rank_stages import build_stages
from pipecast.runtime.sharded_optimizer import state_elements
from pipecast.runtime.stage import StageModule
from pipecast.runtime.step_result import StepResult
from pipecast.values.data.loss import loss_for
from pipecast.values.data.source import fits
from pipecast.values.data.spec import DatasetSpec
from pipecast.values.data.synthetic import synthetic_batch
from pipecast.values.timeline import Event
from pipecast.values.training import learning_rate


@dataclass
class StepRecord:
    step: int
    seconds: float
    """Wall time between barriers around the step."""
    loss: float | None
    peak_allocated: int
    peak_reserved: int
    host: dict[str, float] = field(default_factory=dict)
    """Host seconds issuing each kind of action (see StepResult.host)."""
    host_loop: float = 0.0
    host_before: float = 0.0
    host_after: float = 0.0
    """Before and after the action loop (see StepResult); the rest of `seconds` is the
    barrier after the step."""
    grad_norm: float | None = None
    """The gradients' global norm before clipping (None: not clipped)."""
    host_optimizer: tuple[float, int] = (0.0, 0)
    """(seconds, bytes of weights) the host's optimizer stepped in this step, over the
    rank's stages (HostStep.last_stepped; zeros where the optimizer is on the device)."""
    skipped: bool = False
    """The gradients overflowed under loss scaling: no update."""
    loss_scale: float = 0.0
    graphs_replayed: int = 0
    """CUDA graphs the step replayed (0: it ran eagerly)."""


@dataclass(frozen=True)
class StepProgress:
    """How far a run has got, after each step (from the rank that computes the loss)."""

    done: int
    """Steps completed since the start of training (a resumed run starts past 0)."""
    total: int
    loss: float | None
    seconds: float
    """The step's wall time on that rank."""


@dataclass
class RankReport:
    global_rank: int
    pipeline_rank: int
    replica: int
    stages: list[int]
    steps: list[StepRecord] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    """Action timings of the last step (relative to its start)."""
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    outputs: list[torch.Tensor] = field(default_factory=list)
    """Forward-only plans: the last stage's outputs of the last step, one per micro-batch
    (with TrainJob.capture)."""
    versions: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    device: str = "cpu"
    checkpoints: list[tuple[int, float]] = field(default_factory=list)
    """(steps done, seconds this rank took to write its part and meet the others) for each
    checkpoint it wrote."""
    graphs_captured: int = 0
    """This rank's actions captured as CUDA graphs (0: every step ran eagerly)."""
    held: dict[str, int] = field(default_factory=dict)
    """Elements of each parameter this rank holds at the end (its FSDP shard or its
    tensor-parallel split; the whole where nothing divides it)."""
    optimizer_state: int = 0
    """Elements of optimizer state this rank holds at the end (its share, where the
    optimizer is sharded: pipecast.runtime.sharded_optimizer)."""
    compiled: dict[str, int] = field(default_factory=dict)
    """Compiled execution on this rank (RunConfig.compile): blocks compiled, and backwards
    run whole and split (pipecast.runtime.compiled.counts), over the whole run."""


class _Data:
    """The same batches on every rank; each replica takes its slice."""

    def __init__(self, job: TrainJob, spec: DatasetSpec, device: torch.device) -> None:
        self.job, self.spec, self.device = job, spec, device
        source = job.source()
        self.real = source.load() if source.real else None
        if self.real is not None:
            fits(self.real, spec, job.batch)
        cfg = job.config
        self.dtype = DTYPES[cfg.dtype] if not cfg.autocast else torch.float32
        self._drawn = self.real.epochs(job.batch) if self.real is not None else None

    def _on_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device, self.dtype if t.is_floating_point() else t.dtype)

    def seek(self, step: int) -> None:
        """Continue as a run that has already drawn `step` batches (after a resume)."""
        if self._drawn is not None:
            for _ in range(step):
                next(self._drawn)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.real is None:
            device = self.device if self.device.type == "cuda" else None
            seed = self.job.config.seed + step
            return synthetic_batch(
                self.spec, self.job.batch, seed=seed, dtype=self.dtype, device=device
            )
        assert self._drawn is not None
        x, y = next(self._drawn)
        return self._on_device(x), self._on_device(y)


def drawn_batch(job: TrainJob, step: int, device: torch.device) -> torch.Tensor:
    """The inputs the ranks of `job` draw for `step` (on `device`'s kind, in the run's dtype:
    a GPU's generator draws other numbers than the CPU's from the same seed)."""
    data = _Data(job, job.spec, device)
    data.seek(step)
    return data.batch(step)[0]


def run_rank(ctx: Context, job: TrainJob) -> RankReport:
    """The body of one rank (under spawn or torchrun)."""
    job.check()
    release_earlier_jobs(ctx.device)
    layout = job.layout_of_ranks
    replica, pipeline_rank, context_rank, tensor = layout.place(ctx.rank)
    own = job.plan.stages_of(pipeline_rank)
    spec = job.spec
    mesh = sharding.build_mesh(ctx.device, layout, job.shard)
    counted = compiled.counts()  # this job's compiled backwards: those counted from here
    stages, tied = build_stages(job, ctx, pipeline_rank, replica, mesh)
    split = context.context_group(layout, ctx.rank)
    if split is not None:
        for st in stages.values():
            context.apply(
                st.module,
                split,
                degree=job.cp,
                rank=context_rank,
                seq_len=spec.sample_shape[0],
                device=ctx.device,
            )
    last = job.plan.num_stages - 1
    loss_fn = compiled.compile_loss(loss_for(spec), job.config.compile)
    engine = PipelineEngine(
        job.plan,
        stages,
        pipeline_rank=pipeline_rank,
        replica=replica,
        replicas=job.replicas,
        loss_fn=loss_fn,
        config=job.config,
        device=ctx.device,
        tied=tied,
        layout=layout,
        tensor=tensor,
        context_rank=context_rank,
    )
    data = _Data(job, spec, ctx.device)
    report = RankReport(ctx.rank, pipeline_rank, replica, own, device=str(ctx.device))
    final: StepResult | None = None
    total = job.total_steps
    start = _resume(ctx, job, stages, engine)
    # the rank with the loss
    reporter = replica == 0 and context_rank == 0 and tensor == 0 and last in stages
    data.seek(start)
    # the first step after a resume pays the cold start, as a warm-up step does
    timed_from = max(job.warmup_steps, start + 1 if 0 < start < total - 1 else start)
    try:
        for step in range(start, total):
            inputs, targets = own_share(
                *data.batch(step),
                first=0 in stages,
                last=last in stages,
                replica=replica,
                replicas=job.replicas,
            )
            if job.cp > 1:  # this rank's positions of each sequence
                inputs, targets = (
                    None if t is None else context.share(t, job.cp, context_rank)
                    for t in (inputs, targets)
                )
            _set_lr(stages, job, step)
            engine.watchdog.at(None, f"waiting at the barrier before step {step}")
            if job.before_step is not None:
                job.before_step(ctx.rank, step)
            _barrier(ctx, f"before step {step}")
            began = time.perf_counter()
            result = engine.step(inputs, targets)
            del inputs, targets
            engine.watchdog.at(None, f"waiting at the barrier after step {step}")
            _barrier(ctx, f"after step {step}")
            engine.watchdog.idle()
            seconds = time.perf_counter() - began
            if step >= timed_from:
                report.steps.append(
                    StepRecord(
                        step,
                        seconds,
                        result.loss,
                        result.peak_allocated,
                        result.peak_reserved,
                        host=result.host,
                        host_loop=result.host_loop,
                        host_before=result.host_before,
                        host_after=result.host_after,
                        grad_norm=result.grad_norm,
                        skipped=result.skipped,
                        loss_scale=result.loss_scale,
                        graphs_replayed=result.graphs_replayed,
                        host_optimizer=_host_stepped(stages),
                    )
                )
                final = result
            if reporter:
                write_progress(StepProgress(step + 1, total, result.loss, seconds))
            if job.checkpoint is not None and job.checkpoint.due(step + 1, total):
                engine.watchdog.at(None, f"writing the checkpoint after step {step}")
                writing = time.perf_counter()
                _save(ctx, job, stages, step + 1, replica, engine)
                report.checkpoints.append((step + 1, time.perf_counter() - writing))
                engine.watchdog.idle()
            if job.capture and step == total - 1:
                report.outputs = [o.detach().cpu().clone() for o in result.outputs]
                _capture(report, stages)
            engine.zero_grad()
        if final is not None:  # resolved once, outside every timed step
            report.events = final.events
    finally:
        engine.close()
    report.versions = {s: st.version_log for s, st in stages.items()}
    report.graphs_captured = engine.replay.captured if engine.replay is not None else 0
    if job.config.compile != "off":
        blocks = sum(compiled.compiled_blocks(st.module) for st in stages.values())
        ran = {k: n - counted.get(k, 0) for k, n in compiled.counts().items()}
        report.compiled = {"blocks": blocks, **ran}
    return report


def _capture(report: RankReport, stages: dict[int, StageModule]) -> None:
    """The stages' parameters and gradients, whole (a sharded or split one gathered from its
    ranks: collective, every rank of its mesh takes part)."""
    for st in stages.values():  # slices of nn.Sequential keep global names
        report.optimizer_state += state_elements(st.optimizer)
        with st.resident():
            for name, p in st.module.named_parameters():
                report.held[name] = sharding.local(p.detach()).numel()
                report.params[name] = sharding.full(p.detach()).cpu().clone()
                grad = st.grad_of(p)
                if grad is not None:
                    report.grads[name] = sharding.full(grad.detach()).cpu().clone()


def _set_lr(stages: dict[int, StageModule], job: TrainJob, step: int) -> None:
    """Every stage's learning rate for `step` (RunConfig's schedule)."""
    cfg = job.config
    lr = learning_rate(
        cfg.lr,
        step,
        job.total_steps,
        schedule=cfg.lr_schedule,
        warmup=cfg.lr_warmup,
        floor=cfg.lr_min,
    )
    for st in stages.values():
        if st.optimizer is not None:
            for group in st.optimizer.param_groups:
                group["lr"] = lr


def _resume(
    ctx: Context, job: TrainJob, stages: dict[int, StageModule], engine: PipelineEngine
) -> int:
    """Set this rank's stages (and, on the same layout, its random-number generators) and
    the loss scale to the job's checkpoint; the steps it had completed (0: none to resume
    from)."""
    saved = job.resume_from()
    if saved is None:
        return 0
    if engine.scaler.scale and saved.meta.get("loss_scale"):
        engine.scaler.scale = float(saved.meta["loss_scale"])
        engine.scaler.growth = int(saved.meta.get("loss_scale_growth", 0))
    for s, st in stages.items():
        bounds = job.partition.stages[s]
        with st.resident():
            st.version = checkpoint.load_stage(
                saved, st.module, st.optimizer, bounds.start, bounds.stop
            )
            st.weights_changed()
    if saved.meta.get("layout") == job.layout:
        checkpoint.load_rank(saved, ctx.rank, ctx.device)
    return saved.step


def _save(
    ctx: Context,
    job: TrainJob,
    stages: dict[int, StageModule],
    done: int,
    replica: int,
    engine: PipelineEngine,
) -> None:
    """Every rank writes its part of the checkpoint after `done` steps (the stages once, from
    replica 0: replicas hold the same state); rank 0 marks it complete once all have."""
    cp = job.checkpoint
    assert cp is not None
    if replica == 0:
        for s, st in stages.items():
            with st.resident():
                state = checkpoint.stage_state(st.module, st.optimizer, st.version)
            checkpoint.write_stage(cp.dir, done, s, state)
    checkpoint.write_rank(cp.dir, done, ctx.rank, ctx.device)
    _barrier(ctx, f"after writing the checkpoint of step {done}")
    if ctx.rank == 0:
        scaler = engine.scaler
        scaling = {"loss_scale": scaler.scale, "loss_scale_growth": scaler.growth}
        checkpoint.finish(cp.dir, done, {**job.checkpoint_meta(), **scaling}, cp.keep)


def own_share(
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    first: bool,
    last: bool,
    replica: int,
    replicas: int,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """What one rank keeps of a step's batch: its replica's share of the inputs where it
    runs the first stage and of the targets where it runs the last, nothing else. Every rank
    draws the whole batch (the same seed gives the same data everywhere); a share of several
    replicas' batch is copied out, so the rest is freed rather than held through the step
    by a view (GPT at batch 32: 256 MiB a rank)."""
    share = inputs.shape[0] // replicas

    def mine(t: torch.Tensor) -> torch.Tensor:
        part = t[replica * share : (replica + 1) * share]
        return part.clone() if replicas > 1 else part

    return (mine(inputs) if first else None), (mine(targets) if last else None)


def release_earlier_jobs(device: torch.device) -> None:
    """Free what earlier jobs in this process left to the garbage collector, so this job's
    peak memory is its own. A finished job's engine, stages and CUDA graphs stay reachable
    from a reference cycle (torch's optimizer keeps a frame of the first one built in a
    process) until a full collection: the bench measures its configurations one after
    another in one world, and a graphed configuration there read leftovers as its own, more
    than twice its peak in a fresh process (docs/decisions.md, "Each job's peak its own")."""
    gc.collect()
    if device.type == "cuda":
        devices.clear_workspaces()  # as in a fresh process: a job's stages bring their own
        torch.cuda.empty_cache()


def _barrier(ctx: Context, where: str) -> None:
    if not (dist.is_initialized() and ctx.world > 1):
        return
    try:
        if ctx.device.type == "cuda":
            dist.barrier(device_ids=[ctx.device.index or 0])
            torch.cuda.synchronize(ctx.device)
        else:
            dist.barrier()
    except RuntimeError as exc:
        raise PipecastError(
            f"lost contact with another rank at the barrier {where}: {how_lost(exc)}"
        ) from None


def _host_stepped(stages: dict[int, StageModule]) -> tuple[float, int]:
    """The host's optimizer's (seconds, bytes) in the step just taken, over `stages`."""
    stepped = [st.host_step.last_stepped for st in stages.values() if st.host_step is not None]
    return sum(s for s, _ in stepped), sum(b for _, b in stepped)


def host_optimizer_rate(report: RankReport) -> float:
    """Bytes of weights a second the rank's host optimizer stepped over its timed steps, as
    the run stepped them (beside the backward, on the run's threads); 0 where none ran.
    The probe's isolated reading (Cluster.host_optimizer_rate) can be checked against it."""
    seconds = sum(s.host_optimizer[0] for s in report.steps)
    nbytes = sum(s.host_optimizer[1] for s in report.steps)
    return nbytes / seconds if seconds > 0 else 0.0


def median_step(reports: list[RankReport]) -> float:
    """Median over steps of the slowest rank's step time."""
    per_step: dict[int, float] = {}
    for r in reports:
        for s in r.steps:
            per_step[s.step] = max(per_step.get(s.step, 0.0), s.seconds)
    return statistics.median(per_step.values()) if per_step else 0.0


def summary(reports: list[RankReport], batch: int) -> dict[str, Any]:
    step = median_step(reports)
    losses = [s.loss for r in reports for s in r.steps if s.loss is not None]
    return {
        "step_time": step,
        "samples_per_second": batch / step if step > 0 else 0.0,
        "loss": losses[-1] if losses else None,
        "peak_allocated": [max((s.peak_allocated for s in r.steps), default=0) for r in reports],
        "peak_reserved": [max((s.peak_reserved for s in r.steps), default=0) for r in reports],
        "host_optimizer_rate": [host_optimizer_rate(r) for r in reports],
    }
