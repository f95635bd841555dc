"""`pipecast train` and `pipecast infer`: run a model through a pipeline for real."""

from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import replace
from pathlib import Path

from rich.table import Table

from pipecast.api import make_job
from pipecast.cli.common import add_workload_args, count_arg, output_dir, workload_from_args
from pipecast.cli.console import console, human_bytes, human_seconds, progress
from pipecast.errors import ConfigError
from pipecast.extras import check_installed
from pipecast.planning.recommend.chosen import Chosen, chosen
from pipecast.planning.recommend.predict import predict
from pipecast.planning.schedules.generators import SCHEDULES
from pipecast.report.trace import write_trace
from pipecast.runtime import checkpoint, graphs
from pipecast.runtime.checkpoint import Checkpointing
from pipecast.runtime.config import RunConfig
from pipecast.runtime.job import TrainJob
from pipecast.runtime.launch import under_torchrun
from pipecast.runtime.run import JobResult, run_job
from pipecast.runtime.worker import StepProgress
from pipecast.values.hardware.load import default_cluster
from pipecast.values.models.sources import file_stem
from pipecast.values.profile.types import Profile
from pipecast.values.strategy import Strategy
from pipecast.values.training import LR_SCHEDULES, OFFLOADS


def add_run_args(p: argparse.ArgumentParser, *, inference: bool) -> None:
    add_workload_args(p, required=False)
    p.add_argument(
        "--recommendation",
        metavar="FILE",
        help="run what `pipecast recommend` wrote here: its workload, batch, precision, "
        "optimizer, GPUs, schedule, micro-batches and partition (the measured fastest "
        "where it validated, else the predicted fastest)",
    )
    p.add_argument(
        "--pick", type=int, default=0, help="with --recommendation: the N-th of its ranking"
    )
    p.add_argument(
        "--gpus", type=count_arg("--gpus", 1), default=2, help="processes (GPUs, or CPU ranks)"
    )
    p.add_argument("--replicas", type=int, default=1, help="data-parallel pipeline replicas")
    if not inference:
        p.add_argument("--schedule", default="1f1b", help=", ".join(SCHEDULES))
    p.add_argument("--micro-batches", type=count_arg("--micro-batches", 1), default=8)
    p.add_argument(
        "--batch", type=count_arg("--batch", 1), default=64, help="global batch per step"
    )
    p.add_argument(
        "--partition",
        default="auto",
        help="auto (quick profile + balanced), a method, or boundaries 0,4,10,40",
    )
    p.add_argument("--steps", type=count_arg("--steps", 1), default=10, help="timed steps")
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument("--autocast", action="store_true")
    p.add_argument("--optimizer", choices=("sgd", "momentum", "adam"), default="sgd")
    p.add_argument("--lr", type=float, default=0.01)
    if not inference:
        p.add_argument(
            "--lr-schedule",
            choices=LR_SCHEDULES,
            default="constant",
            help="after the warm-up, keep the rate or bring it to --lr-min at the last step",
        )
        p.add_argument(
            "--lr-warmup", type=int, default=0, help="steps over which the rate rises to --lr"
        )
        p.add_argument("--lr-min", type=float, default=0.0)
        p.add_argument(
            "--loss-scale",
            type=float,
            default=None,
            help="dynamic loss scaling from this scale (default: 65536 for fp16, off "
            "otherwise; 0: off)",
        )
        p.add_argument(
            "--clip-grad-norm",
            type=float,
            default=0.0,
            help="scale the gradients to this global L2 norm over all stages when above it",
        )
    p.add_argument("--recompute", choices=("none", "all", "all-but-last"), default="none")
    if not inference:
        p.add_argument(
            "--offload",
            choices=OFFLOADS,
            default="none",
            help="activations: keep what the forward saves for the backward in pinned host "
            "memory (eager: no CUDA graphs); optimizer: step the optimizer on the host, its "
            "state there; both; weights: the optimizer and the weights on the host, streamed "
            "in a block at a time (eager, no recomputation); all: weights and activations",
        )
    p.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="replay every action as a CUDA graph after the first step, which captures them "
        "(default: on GPUs, for every schedule but pipedream; --no-cuda-graphs: eager)",
    )
    if inference:
        p.add_argument(
            "--mode",
            choices=("throughput", "latency"),
            default="throughput",
            help="latency: one request (batch 1, one micro-batch) through the pipeline",
        )
        p.add_argument(
            "--compare",
            choices=("onnxruntime", "deepspeed"),
            action="append",
            default=[],
            help="also run the model, with the pipeline's weights, in ONNX Runtime or "
            "DeepSpeed's inference engine (repeatable) on the last step's inputs: speed and "
            "the output difference",
        )
    p.add_argument("--timeout", type=float, default=300.0, help="seconds any wait may take")
    p.add_argument("--out-dir", type=output_dir, default="pipecast-out", help="where traces go")
    if not inference:
        p.add_argument(
            "--data-dir",
            help="train on real samples: MNIST IDX files or CIFAR-10 python batches here "
            "(--dataset mnist or cifar10); default: synthetic batches (real for digits)",
        )
        c = p.add_argument_group("checkpoints")
        c.add_argument(
            "--checkpoint-dir",
            help="write the model's and optimizer's state here after the last step (and "
            "every --checkpoint-every steps); under torchrun, a file system every node shares",
        )
        c.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints")
        c.add_argument("--keep", type=int, default=2, help="complete checkpoints kept")
        c.add_argument(
            "--resume",
            action="store_true",
            help="start from the newest complete checkpoint in --checkpoint-dir (on any "
            "partition, schedule or GPU count); --steps counts from the start of training",
        )


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
    if getattr(args, "recommendation", None):
        followed = _follow(args, args.recommendation, args.pick)
    elif args.model is None:
        raise ConfigError("--model is required (or --recommendation FILE)")
    workload = workload_from_args(args)
    schedule = "forward-only" if args.inference else args.schedule
    if getattr(args, "mode", "") == "latency":
        args.batch, args.micro_batches = 1, 1
    _check_installed(getattr(args, "compare", []))
    cp = _checkpointing(args)
    with console.status(
        "planning (quick profile and partition)" if args.partition == "auto" else "planning"
    ):
        job, profile = make_job(
            workload,
            gpus=args.gpus,
            replicas=args.replicas,
            schedule=schedule,
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
        )
    console.print(
        f"{schedule} on {job.world} {args.device} rank(s), partition "
        f"{job.partition.boundaries}, batch {job.batch} in "
        f"{job.plan.num_microbatches} micro-batches"
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
    print_result(result, inference=args.inference)
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
        console.print(f"checkpoint: {last.path} ({last.step} steps{took})")
    _write_traces(args, result, profile)
    return 0


def _check_installed(runtimes: list[str]) -> None:
    """Before anything runs: every runtime --compare names is installed."""
    from pipecast.measuring.interop import deepspeed_inference, onnx_runtime

    install = {"onnxruntime": onnx_runtime.INSTALL, "deepspeed": deepspeed_inference.INSTALL}
    for name in runtimes:
        check_installed(name, needed_by=f"--compare {name}", install=install[name])


def _config(args: argparse.Namespace) -> RunConfig:
    return RunConfig(
        dtype=args.dtype,
        autocast=args.autocast,
        optimizer=args.optimizer,
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
    )


def _write_traces(args: argparse.Namespace, result: JobResult, profile: Profile | None) -> None:
    """The measured step as a Perfetto trace, with the prediction from the quick profile
    beside it when the partition came from one."""
    job = result.job
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = file_stem(job.workload.model) if job.workload is not None else "model"
    trace = out / f"{model}-{job.plan.name}-{job.world}.measured.trace.json"
    timelines = [("measured", result.timeline())]
    if profile is not None:
        strategy = Strategy(
            kind="pipeline" if args.replicas == 1 else "hybrid",
            stages=job.plan.num_ranks,
            replicas=args.replicas,
            schedule=job.plan.name,
            microbatches=args.micro_batches,
            partition=",".join(map(str, job.partition.boundaries)),
            recompute=args.recompute,
            offload=job.config.offload,
            cuda_graphs=graphs.enabled(job.plan, job.config, job.device),
        )
        predicted = predict(
            profile,
            default_cluster(profile.device, job.world),
            strategy,
            job.batch,
            optimizer=args.optimizer,
            clip=job.config.clip_grad_norm > 0,
            uneven=True,
        )
        timelines.insert(0, ("predicted", predicted.timeline))
        console.print(
            f"predicted step {human_seconds(predicted.step_time)} (from the quick profile)"
        )
    write_trace(str(trace), *timelines)
    console.print(f"trace: {trace}")


def _follow(args: argparse.Namespace, path: str, pick: int) -> Chosen:
    """Set `args` to the strategy, workload and precision of the recommendation at `path`."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the recommendation {path}: {exc}") from None
    c = chosen(doc, pick)
    if c.workload is None and args.model is None:
        raise ConfigError(f"{path} does not name its model: give --model")
    if c.workload is not None:
        if args.model not in (None, c.workload.model):
            raise ConfigError(f"{path} is for {c.workload.model}, not {args.model}")
        for key, value in c.workload.to_dict().items():
            setattr(args, key, value)
    s = c.strategy
    args.gpus, args.replicas = s.gpus, s.replicas
    args.schedule, args.micro_batches = c.schedule, s.microbatches
    args.batch, args.partition = c.batch, c.partition
    args.recompute, args.cuda_graphs, args.offload = s.recompute, s.cuda_graphs, s.offload
    args.dtype, args.autocast, args.optimizer = c.dtype, c.autocast, c.optimizer
    args.device = "cuda" if c.device.startswith("cuda") else "cpu"
    console.print(f"running {c.label} (predicted {human_seconds(c.predicted)} a step) from {path}")
    return c


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


TABLE_ROWS = 12
"""Timed steps the table shows: all up to this many, else the first two and the last ten."""


def print_result(result: JobResult, *, inference: bool) -> None:
    table = Table(title="per step (slowest rank)")
    steps: dict[int, float] = {}
    losses: dict[int, float] = {}
    norms: dict[int, float] = {}
    for r in result.reports:
        for s in r.steps:
            steps[s.step] = max(steps.get(s.step, 0.0), s.seconds)
            if s.loss is not None and r.replica == 0:
                losses[s.step] = s.loss
            if s.grad_norm is not None:
                norms[s.step] = s.grad_norm
    columns = ["step", "time", "samples/s", "loss" if not inference else "-"]
    for col in columns + (["grad norm"] if norms else []):
        table.add_column(col, justify="right")
    order = sorted(steps)
    shown = order if len(order) <= TABLE_ROWS else order[:2] + order[-(TABLE_ROWS - 2) :]
    for i, step in enumerate(shown):
        if i == 2 and len(shown) < len(order):
            table.add_row("...", f"{len(order) - len(shown)} more", *[""] * (len(columns) - 2))
        seconds = steps[step]
        loss = f"{losses[step]:.4f}" if step in losses and not inference else ""
        norm = [f"{norms[step]:.4g}" if step in norms else ""] if norms else []
        table.add_row(
            str(step), human_seconds(seconds), f"{result.job.batch / seconds:,.1f}", loss, *norm
        )
    console.print(table)
    scaled = [s for r in result.reports if r.global_rank == 0 for s in r.steps if s.loss_scale]
    if scaled:
        skipped = sum(s.skipped for s in scaled)
        console.print(
            f"loss scaling: {skipped} of {len(scaled)} timed steps skipped (gradients "
            f"overflowed); the last ran at scale {scaled[-1].loss_scale:g}"
        )
    summary = result.summary
    memory = ", ".join(human_bytes(m) for m in summary["peak_allocated"])
    line = (
        f"median step {human_seconds(summary['step_time'])}, "
        f"{summary['samples_per_second']:,.1f} samples/s"
    )
    if inference and steps:
        line += f", batch latency {human_seconds(statistics.median(steps.values()))}"
    console.print(
        line + (f"; peak memory per rank: {memory}" if any(summary["peak_allocated"]) else "")
    )
