"""`pipecast train` and `pipecast infer`: run a model through a pipeline for real."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from pipecast import jsonio
from pipecast.api import make_job
from pipecast.cli.common import note_sizes, workload_from_args
from pipecast.cli.console import console, counted, human_seconds, progress
from pipecast.cli.run_args import BATCH, GPUS, MICRO_BATCHES, add_run_args
from pipecast.cli.train_checks import (
    check_fits,
    check_host_fits,
    check_one_request,
    check_runtimes,
    check_shard,
    check_shard_optimizer,
)
from pipecast.cli.train_checks import check_ranks as _check_ranks  # tests stand in for it
from pipecast.cli.train_summary import print_result
from pipecast.errors import ConfigError, DataError
from pipecast.planning.recommend.chosen import Chosen, chosen
from pipecast.planning.recommend.predict import Prediction, predict
from pipecast.report.trace import QUICK_LABEL, write_trace
from pipecast.runtime import checkpoint, devices, graphs
from pipecast.runtime.checkpoint import Checkpointing
from pipecast.runtime.config import RunConfig
from pipecast.runtime.job import TrainJob
from pipecast.runtime.launch import under_torchrun
from pipecast.runtime.run import JobResult, run_job
from pipecast.runtime.worker import StepProgress
from pipecast.values.batching import check_batch
from pipecast.values.data.source import DataSource
from pipecast.values.hardware.load import default_cluster
from pipecast.values.models.sources import file_stem
from pipecast.values.profile.types import Profile
from pipecast.values.strategy import Strategy


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "train",
        help="train through a pipeline on torch.distributed",
        description="Run training steps with a pipeline schedule on one process "
        "per GPU (NCCL) or CPU ranks (gloo); under torchrun, across nodes.",
    )
    add_run_args(p, inference=False)
    p.set_defaults(func=run, inference=False)


def run(args: argparse.Namespace) -> int:
    if under_torchrun() and os.environ["RANK"] != "0":
        console.quiet = True  # rank 0 speaks for every rank
    followed = None
    check_one_request(args)
    if getattr(args, "recommendation", None):
        followed = _follow(args, args.recommendation, args.pick or 0)
    elif args.pick is not None:
        raise ConfigError(
            f"--pick {args.pick} picks from --recommendation's ranking, and no "
            "--recommendation is given: add --recommendation FILE, or drop --pick"
        )
    elif args.model is None:
        raise ConfigError("--model is required (or --recommendation FILE)")
    if args.device is None:
        args.device = default_device()
    args.gpus = GPUS if args.gpus is None else args.gpus
    workload = workload_from_args(args)
    schedule = "forward-only" if args.inference else args.schedule
    if schedule == "forward-only" and not args.inference:
        given = f"{args.recommendation} plans" if followed else "--schedule"
        raise ConfigError(
            f"{given} forward-only, which trains nothing (forwards only): `pipecast infer` "
            "runs inference, with the same options"
        )
    if getattr(args, "mode", "") == "latency":
        args.batch, args.micro_batches = 1, 1
    args.batch = BATCH if args.batch is None else args.batch  # infer leaves them unset
    if args.micro_batches is None:
        args.micro_batches = _default_micro_batches(args, schedule)
    check_runtimes(getattr(args, "compare", []))
    check_batch(args.batch, args.replicas, args.micro_batches, flags=True)  # before work
    check_shard(getattr(args, "shard", "none"), args.replicas)
    check_shard_optimizer(args)
    if not under_torchrun():  # under torchrun the launcher made the ranks
        _check_ranks(args.gpus, args.device, args.recommendation)
    if getattr(args, "data_dir", None) is not None:  # before the quick profile
        DataSource(workload.dataset, directory=args.data_dir).check(workload.spec, args.batch)
    cp = _checkpointing(args)
    note_sizes(workload)  # once every check has passed
    if followed is not None:
        args.predicted_step, args.followed_label = followed.predicted, followed.label
        console.print(
            f"running {followed.label} (predicted {human_seconds(followed.predicted)} a step) "
            f"from {args.recommendation}"
        )
    with console.status(
        "planning (quick profile and partition)" if args.partition == "auto" else "planning"
    ):
        job, profile = make_job(
            workload,
            gpus=args.gpus,
            replicas=args.replicas,
            schedule=schedule,
            virtual=getattr(args, "virtual_stages", 0),
            microbatches=args.micro_batches,
            batch=args.batch,
            partition=args.partition,
            steps=args.steps,
            warmup_steps=args.warmup_steps,
            device=args.device,
            config=_config(args),
            exact_init=args.device == "cpu",
            checkpoint=cp,
            data_dir=getattr(args, "data_dir", None),
            shard=args.shard,
            tensor_parallel=args.tensor_parallel,
            plan=followed.plan if followed is not None else None,
            context_parallel=getattr(args, "context_parallel", 1),
        )
    jsonio.check_output(_trace_path(args, job))  # before the run, not after it
    if getattr(args, "kernel_trace", False):
        job = _with_kernel_trace(args, job)
    if not under_torchrun():
        _check_memory(args, job, profile, followed)
    console.print(
        f"{_layout(job, schedule)} on {counted(job.world, f'{args.device} rank')}, partition "
        f"{job.partition.boundaries}, batch {job.batch} in "
        f"{counted(job.plan.num_microbatches, 'micro-batch', 'micro-batches')}"
    )
    if getattr(args, "compare", None):
        if args.device != "cpu" and args.dtype != "fp32":
            console.print("comparing in fp32: the pipeline's outputs carry its own rounding")
        job = replace(job, capture=True)
    saved = job.resume_from()
    first = saved.step if saved is not None else 0
    if saved is not None:
        console.print(f"resuming from {saved.path} ({saved.step} steps done)")
    result = _run_with_bar(job, first, "inference" if args.inference else "training")
    if result is None:  # a torchrun rank other than 0
        return 0
    print_result(result, inference=args.inference, first=first)
    if getattr(args, "compare", None):
        from pipecast.cli.infer_compare import compare

        compare(result, args.compare)
    if followed is not None and followed.predicted > 0:
        measured = result.summary["step_time"]
        console.print(
            f"recommended as {human_seconds(followed.predicted)} a step; measured "
            f"{human_seconds(measured)} ({followed.predicted / measured - 1:+.1%})"
        )
    if cp is not None and (last := checkpoint.latest(cp.dir)) is not None:
        seconds = [t for r in result.reports for done, t in r.checkpoints if done == last.step]
        took = f", written in {human_seconds(max(seconds))}" if seconds else ""
        done = _steps_done(last.step, job.warmup_steps)
        console.print(f"checkpoint: {last.path} ({done}{took})", soft_wrap=True)  # one line
    _write_traces(args, result, profile)
    return 0


def _check_memory(
    args: argparse.Namespace, job: TrainJob, profile: Profile | None, followed: Chosen | None
) -> None:
    """The plan's predicted memory against what the GPUs and the host have free (the
    recommendation's prediction, else the quick profile's), before anything starts."""
    offloads = job.config.offload != "none"
    if job.device != "cuda" and not offloads:
        return
    if followed is not None:
        need, host = followed.peak_memory, followed.host_memory
    else:
        predicted = _quick_prediction(args, job, profile)
        need = predicted.peak_memory if predicted is not None else 0
        host = predicted.host_memory if predicted is not None else 0
    if job.device == "cuda":
        check_fits(need, devices.free_on_gpus(), job.world)
    check_host_fits(host, devices.free_host_memory())


def _default_micro_batches(args: argparse.Namespace, schedule: str) -> int:
    """--micro-batches when not given: one where a replica is one stage (nothing to overlap:
    more would only run smaller products; a batch that does not fit says so and names the
    flag), else MICRO_BATCHES for a pipeline's stages to overlap."""
    width = (
        args.replicas * getattr(args, "tensor_parallel", 1) * getattr(args, "context_parallel", 1)
    )
    stages = args.gpus // max(width, 1)
    return 1 if stages <= 1 and schedule != "pipedream" else MICRO_BATCHES


def _layout(job: TrainJob, schedule: str) -> str:
    """How the job spreads the model: the schedule, or with replicas or tensor parallelism
    its mesh as recommend labels it (Strategy.mesh: 'FSDP x2 (no reshard)' for one stage,
    'data parallel x2 x 1f1b 2 stages' for two); then its context parallelism."""
    within = f" x context parallel x{job.cp}" if job.cp > 1 else ""
    if job.replicas == 1 and job.tp == 1:
        return schedule + within
    mesh = Strategy(
        kind="hybrid",
        stages=job.plan.num_ranks,
        replicas=job.replicas,
        schedule=schedule,
        shard=job.shard,
        shard_optimizer=job.config.shard_optimizer,
        tp=job.tp,
    ).mesh()
    return mesh + within


def _steps_done(step: int, warmup: int) -> str:
    """A checkpoint's count of steps (warm-up included, as --resume counts them) in the
    step column's numbers, which count the timed steps from 1."""
    warm = counted(min(step, warmup), "warm-up step")
    timed = step - warmup
    if timed < 1:
        return f"after {warm}"
    steps = "step 1" if timed == 1 else f"steps 1 to {timed}"
    return f"after {warm} and {steps}" if warmup else f"after {steps}"


def _quick_prediction(
    args: argparse.Namespace, job: TrainJob, profile: Profile | None
) -> Prediction | None:
    """`job` predicted from the quick profile its partition came from (None: none, or a
    mesh, which that profile does not price)."""
    if profile is None or job.meshed:
        return None
    return predict(
        profile,
        default_cluster(profile.device, job.world),
        _strategy_of(args, job),
        job.batch,
        optimizer=args.optimizer,
        clip=job.config.clip_grad_norm > 0,
        uneven=True,
    )


def _strategy_of(args: argparse.Namespace, job: TrainJob) -> Strategy:
    """The strategy `job` runs, as the planner names it."""
    return Strategy(
        kind="pipeline" if args.replicas == 1 else "hybrid",
        stages=job.plan.num_ranks,
        replicas=args.replicas,
        schedule=job.plan.name,
        virtual=job.plan.num_stages // job.plan.num_ranks if job.plan.name == "interleaved" else 0,
        microbatches=args.micro_batches,
        partition=",".join(map(str, job.partition.boundaries)),
        recompute=args.recompute,
        offload=job.config.offload,
        cuda_graphs=graphs.enabled(job.plan, job.config, job.device),
        shard_optimizer=job.config.shard_optimizer,
    )


def default_device() -> str:
    """cuda where torch finds GPUs (as recommend plans for them), else cpu."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def _config(args: argparse.Namespace) -> RunConfig:
    return RunConfig(
        dtype=args.dtype,
        autocast=args.autocast,
        optimizer=args.optimizer,
        shard_optimizer=getattr(args, "shard_optimizer", False),
        lr=args.lr,
        lr_schedule=getattr(args, "lr_schedule", "constant"),
        lr_warmup=getattr(args, "lr_warmup", 0),
        lr_min=getattr(args, "lr_min", 0.0),
        clip_grad_norm=getattr(args, "clip_grad_norm", 0.0),
        loss_scale=getattr(args, "loss_scale", None),
        recompute=args.recompute,
        offload=getattr(args, "offload", "none"),
        timeout_s=args.timeout,
        cuda_graphs=args.cuda_graphs,
        compile=args.compile,
        compile_budget=args.compile_budget,
        channels_last=args.channels_last,
        float8=getattr(args, "float8", False),
        weight_batch=getattr(args, "weight_batch", 1),
    )


def _write_traces(args: argparse.Namespace, result: JobResult, profile: Profile | None) -> None:
    """The measured step as a Perfetto trace, with the prediction from the quick profile
    beside it when the partition came from one."""
    job = result.job
    trace = _trace_path(args, job)
    timelines = [("measured", result.timeline())]
    # the quick profile's few repeats at one size are enough to balance the stages, not to
    # quote a step time: drawn beside the measurement in the trace, not printed
    predicted = _quick_prediction(args, job, profile)
    if predicted is not None:
        timelines.insert(0, (QUICK_LABEL, predicted.timeline))
    write_trace(str(trace), *timelines)
    console.print(f"trace: {trace}")
    summary: dict[str, Any] = {
        k: v for k, v in result.summary.items() if isinstance(v, int | float | list)
    }
    predicted_step = getattr(args, "predicted_step", 0.0)
    if predicted_step:
        summary["predicted_step_time"] = predicted_step
    summary["strategy"] = getattr(args, "followed_label", "") or _layout(job, job.plan.name)
    jsonio.write_atomic(
        str(trace).replace(".measured.trace.json", ".summary.json"),
        json.dumps(summary, indent=1) + "\n",
    )


def _with_kernel_trace(args: argparse.Namespace, job: TrainJob) -> TrainJob:
    """`job` with its step before the last traced under torch.profiler, beside its trace."""
    from pipecast.measuring.kernel_trace import KernelTracer

    stem = str(_trace_path(args, job)).replace(".measured.trace.json", ".kernels")
    console.print(f"kernel trace: {stem}.trace.json.gz, summary {stem}.json")
    return replace(job, before_step=KernelTracer(stem, job.total_steps - 2))


def _trace_path(args: argparse.Namespace, job: TrainJob) -> Path:
    """Where the run's trace goes: named by its model, schedule, ranks and variant."""
    model = file_stem(job.workload.model) if job.workload is not None else "model"
    name = f"{model}-{job.plan.name}-{job.world}{_variant(job)}.measured.trace.json"
    return Path(args.out_dir) / name


def _variant(job: TrainJob) -> str:
    """What sets a run apart beyond its model, schedule and ranks, for its trace's name (so
    runs of other strategies do not overwrite it): '' for a plain pipeline, else e.g.
    '-fsdp2-tp2', '-dp2-offload-activations', '-recompute-all', '-v4' (4 virtual stages a
    rank)."""
    parts = []
    if job.plan.name == "interleaved" and job.plan.num_stages != 2 * job.plan.num_ranks:
        parts.append(f"v{job.plan.num_stages // job.plan.num_ranks}")
    if job.replicas > 1:
        parts.append(("fsdp" if job.shard != "none" else "dp") + str(job.replicas))
    if getattr(job.config, "shard_optimizer", False):
        parts.append("shard-optimizer")
    if job.cp > 1:
        parts.append(f"cp{job.cp}")
    if job.tp > 1:
        parts.append(f"tp{job.tp}")
    for name, value in (("offload", job.config.offload), ("recompute", job.config.recompute)):
        if value != "none":
            parts.append(f"{name}-{value}")
    return "".join(f"-{p}" for p in parts)


def _follow(args: argparse.Namespace, path: str, pick: int) -> Chosen:
    """Set `args` to the strategy, workload and precision of the recommendation at `path`."""
    doc = read_recommendation(path)
    try:
        c = chosen(doc, pick)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DataError(
            f"{path} is a damaged recommendation ({type(exc).__name__}: {exc}): run "
            "`pipecast recommend -o` again"
        ) from None
    if c.workload is None and args.model is None:
        raise ConfigError(f"{path} does not name its model: give --model")
    if c.workload is not None:
        if args.model not in (None, c.workload.model):
            raise ConfigError(
                f"{path} is for {c.workload.model}, not {args.model}: leave --model out to run "
                f"it, or `pipecast recommend --model {args.model}` for a recommendation of that"
            )
        for key, value in c.workload.to_dict().items():
            setattr(args, key, value)
    s = c.strategy
    planned = "cuda" if c.device.startswith("cuda") else "cpu"
    for flag, given, want in (("--gpus", args.gpus, s.gpus), ("--device", args.device, planned)):
        if given not in (None, want):  # the plan is for `want`: it would be dropped
            raise ConfigError(
                f"{flag} {given}: {path} plans {s.gpus} {planned} rank(s), its partition and "
                f"schedule for them: plan for {flag} {given} with `pipecast recommend {flag} "
                f"{given}` and run that, or drop {flag}"
            )
    args.gpus, args.replicas = s.gpus, s.replicas
    args.shard, args.tensor_parallel, args.context_parallel = s.shard, s.tp, s.cp
    args.shard_optimizer = s.shard_optimizer
    args.schedule, args.micro_batches = c.schedule, s.microbatches
    args.virtual_stages = s.virtual if c.schedule == s.schedule else 0
    args.batch, args.partition = c.batch, c.partition
    args.recompute, args.cuda_graphs, args.offload = s.recompute, s.cuda_graphs, s.offload
    args.compile, args.channels_last, args.float8 = s.compile, s.channels_last, s.float8
    args.dtype, args.autocast, args.optimizer = c.dtype, c.autocast, c.optimizer
    args.device = "cuda" if c.device.startswith("cuda") else "cpu"
    return c


def read_recommendation(path: str) -> dict[str, Any]:
    """The document at `path` if it is a recommendation (a ranking and a batch), else a
    one-line DataError naming the file, what it holds and what was expected."""
    doc = jsonio.parse(jsonio.read_text(path), path)
    if isinstance(doc, dict) and "ranked" in doc and "batch" in doc:
        return doc
    held = jsonio.describe(doc)
    if isinstance(doc, dict) and "kind" not in doc:
        held = "a JSON object with no ranking ('ranked') or batch"
    raise DataError(
        f"{path} holds {held}, not a recommendation: pass the file `pipecast recommend -o` wrote"
    )


def _run_with_bar(job: TrainJob, first: int, what: str) -> JobResult | None:
    """Run `job` under a progress bar of its steps (warm-up included), with the last loss."""
    with progress(note=True) as bar:
        task = bar.add_task(what, total=job.total_steps, completed=first, note="")

        def update(p: StepProgress) -> None:
            note = f"loss {p.loss:.4f}" if p.loss is not None else ""
            bar.update(task, completed=p.done, note=note)

        return run_job(job, progress=update)


def _checkpointing(args: argparse.Namespace) -> Checkpointing | None:
    if getattr(args, "checkpoint_dir", None) is None:
        if getattr(args, "resume", False) or getattr(args, "checkpoint_every", 0):
            raise ConfigError("--resume and --checkpoint-every need --checkpoint-dir")
        return None
    return Checkpointing(
        args.checkpoint_dir, every=args.checkpoint_every, keep=args.keep, resume=args.resume
    )
