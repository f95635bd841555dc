"""`pipecast recommend`: the fastest way to train a model on your GPUs, before you spend them."""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

from pipecast.cli.common import (
    AUTOCAST_HELP,
    OPTIMIZER_HELP,
    add_workload_args,
    check_model_named,
    count_arg,
    gib_arg,
    margin_arg,
    methods_arg,
    note_sizes,
    output_file,
    workload_from_args,
)
from pipecast.cli.console import console, human_bytes, progress
from pipecast.cli.model_size import check_model_size
from pipecast.cli.recommend_tables import print_recommendation, print_validation
from pipecast.cli.train_verb import default_device
from pipecast.errors import ConfigError
from pipecast.orchestration.recommend.session import Events, Request, both_profiles, recommend_for
from pipecast.planning.recommend.predict import Prediction
from pipecast.runtime import float8
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.hardware.load import load_cluster
from pipecast.values.profile.types import Profile
from pipecast.values.training import Compile


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "recommend",
        help="rank single-GPU, data-parallel, pipeline and hybrid strategies; pick the fastest",
        description="Predict every strategy's step time and per-GPU memory with the simulator "
        "(from a cached profile and probe of this machine, measured on first use, or for GPUs "
        "this machine lacks from pipecast's own profiles of them), drop what does not fit, rank "
        "the rest and explain the winner. --validate K runs the top K.",
    )
    _add_target_args(p)
    _add_calibration_args(p)
    _add_planning_args(p)
    _add_validation_args(p)
    p.set_defaults(func=run)


def _add_target_args(p: argparse.ArgumentParser) -> None:
    """What is to be trained, and on what: the workload, the batch, the GPUs, precision."""
    add_workload_args(p, required=False)
    p.add_argument(
        "--batch",
        type=count_arg("--batch", 1),
        default=0,
        help="global batch per step (default: 256 on GPUs, 32 on CPU)",
    )
    p.add_argument(
        "--gpus", type=count_arg("--gpus", 1), default=0, help="GPUs (default: all here, or 4)"
    )
    p.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="where to profile and validate (auto: cuda if present; without GPUs and without "
        "--cluster, plan for an 8-GPU H100 node from pipecast's own profiles of it; cpu: plan "
        "for this machine's CPU ranks)",
    )
    p.add_argument(
        "--dtype",
        choices=("fp32", "bf16", "fp16"),
        help="default: bf16 where the strategies run on GPUs, fp32 on CPU ranks",
    )
    p.add_argument("--autocast", action="store_true", help=AUTOCAST_HELP)


def _add_calibration_args(p: argparse.ArgumentParser) -> None:
    """Where the profile and the cluster come from."""
    p.add_argument(
        "--cluster",
        help="cluster JSON or preset (h100-nvlink, h200-nvlink, cpu) instead of probing this "
        "machine; for GPUs this machine does not have, the profile is pipecast's own of that "
        "GPU where it ships one, or --profile",
    )
    p.add_argument("--profile", help="use this profile instead of the cached one")
    p.add_argument(
        "--recalibrate",
        action="store_true",
        help="profile the model and probe the GPUs again (the host's speed may have moved "
        "since); on GPUs the new profile's host costs are pooled with the earlier ones of this "
        "model here (the newest 8), since one reading catches the host in one spell",
    )


def _add_planning_args(p: argparse.ArgumentParser) -> None:
    """What the strategies are predicted for: optimizer, memory, serving, methods, graphs."""
    p.add_argument(
        "--optimizer", choices=("sgd", "momentum", "adam"), default="sgd", help=OPTIMIZER_HELP
    )
    p.add_argument(
        "--memory-margin",
        type=margin_arg,
        default=0.1,
        help="fraction of GPU memory kept free (default 0.1)",
    )
    p.add_argument(
        "--serve",
        action="store_true",
        help="the fastest way to serve the model: inference (forward only) on --batch "
        "samples; --batch 1 ranks by one request's latency",
    )
    p.add_argument(
        "--memory-limit",
        type=gib_arg,
        default=0.0,
        metavar="GiB",
        help="plan for GPUs of this much memory instead of the ones at hand (strategies "
        "that do not fit may move activations, optimizer state or weights to the host)",
    )
    p.add_argument(
        "--epoch-samples",
        type=count_arg("--epoch-samples", 1),
        default=0,
        help="samples per epoch for the time-per-epoch column (default: the data set's "
        "training split, e.g. 50,000 for cifar10 and 1,281,167 for imagenet; 50,000 for a "
        "synthetic set)",
    )
    p.add_argument(
        "--methods",
        type=methods_arg,
        default=("balanced",),
        help="partition methods to consider, comma-separated (e.g. balanced,blocks)",
    )
    p.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="predict strategies as CUDA graphs, one launch per action (default: on GPUs, as "
        "the runtime runs them); --no-cuda-graphs: eager, as train --no-cuda-graphs runs",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="also rank every strategy with its blocks inductor-compiled (train --compile "
        "blocks), priced from a profile of the compiled blocks taken here",
    )
    p.add_argument(
        "--channels-last",
        action="store_true",
        help="also rank them with convolutions in channels-last order (with --compile: "
        "compiled and channels-last)",
    )
    p.add_argument(
        "--float8",
        action="store_true",
        help="also rank them with compiled Float8 Linears (H100, H200; torchao)",
    )


def _add_validation_args(p: argparse.ArgumentParser) -> None:
    """What is shown and measured, and where the recommendation is written."""
    p.add_argument(
        "--top",
        type=count_arg("--top", 1),
        default=12,
        help="rows to show; a strategy a lower bound shows cannot join them (nor be its "
        "family's fastest or a close call) is counted, not priced (default: 12)",
    )
    p.add_argument(
        "--validate",
        type=count_arg("--validate", 0, also="auto"),
        default=0,
        metavar="K|auto",
        help="run the top K for a few steps and decide by measurement; 'auto': the best and "
        "every strategy whose prediction is within error of it (at most 4)",
    )
    p.add_argument(
        "--rounds",
        type=count_arg("--rounds", 1),
        default=2,
        help="with --validate: measure every candidate this many times, round-robin, and "
        "keep each one's median (the host's speed moves between runs; default 2)",
    )
    p.add_argument(
        "-o",
        "--output",
        type=output_file,
        default="pipecast-out/recommendation.json",
        help="where to write the ranking and the pick as JSON, for `pipecast train "
        "--recommendation` (default: pipecast-out/recommendation.json)",
    )


def _executions(args: argparse.Namespace) -> tuple[tuple[Compile, bool, bool], ...]:
    """The other ways to run the blocks the flags ask to rank (Request.executions)."""
    out: list[tuple[Compile, bool, bool]] = []
    if args.compile:
        out.append(("blocks", args.channels_last, False))
    elif args.channels_last:
        out.append(("off", True, False))
    if args.float8:
        device = args.device if args.device != "auto" else default_device()
        if why := float8.why_not(device):
            raise ConfigError(why)
        out.append(("blocks", args.channels_last, True))
    return tuple(out)


def run(args: argparse.Namespace) -> int:
    if args.recalibrate and args.profile:  # before reading a file that may not be there
        raise both_profiles()
    check_model_named(args, "recommend plans --profile's model, or its own default")
    workload = workload_from_args(args) if args.model else None
    if workload is not None and args.profile is None:  # it is profiled here, or its blocks
        check_model_size(workload, device=args.device)  # counted: not past what fits
    request = Request(
        workload=workload,
        batch=args.batch,
        gpus=args.gpus,
        device=args.device,
        dtype=args.dtype,
        autocast=args.autocast,
        optimizer=args.optimizer,
        memory_margin=args.memory_margin,
        memory_limit=int(args.memory_limit * 2**30),
        serve=args.serve,
        methods=args.methods,
        cuda_graphs=args.cuda_graphs,
        epoch_samples=args.epoch_samples,
        cluster=load_cluster(args.cluster) if args.cluster else None,
        profile=Profile.load(args.profile) if args.profile else None,
        recalibrate=args.recalibrate,
        validate=args.validate,
        rounds=args.rounds,
        executions=_executions(args),
        keep=args.top,
    )
    if request.workload is not None and request.profile is None:
        request.workload.check()  # before the first "calibrating" line
    if request.workload is not None:
        note_sizes(request.workload)
    with _Shown(args.top) as shown:
        outcome = recommend_for(request, shown.events)
    if outcome.measured:
        print_validation(outcome.measured)
    outcome.save(args.output)
    where = f" on {outcome.request.gpus} x {outcome.target}" if outcome.elsewhere else ""
    verb = "infer" if args.serve else "train"
    console.print(f"run it{where}: pipecast {verb} --recommendation {args.output} --steps 100")
    return 0


class _Shown:
    """What the user sees while a recommendation is made: a progress bar while profiling, a
    spinner while probing or validating, the profile's and the cluster's origins, the
    ranking and any notes."""

    def __init__(self, top: int) -> None:
        self.top = top
        self.stack = contextlib.ExitStack()
        self.bar: Any = None
        self.task: Any = None
        self.status: Any = None
        self.events = Events(
            profiling=self._profiling,
            calibrating=self._calibrating,
            calibrated=self._calibrated,
            ranked=lambda rec: print_recommendation(rec, self.top),
            validating=self._validating,
            note=lambda text: console.print(f"[yellow]{text}[/]"),
        )

    def __enter__(self) -> _Shown:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def _stop(self) -> None:
        self.stack.close()
        self.stack = contextlib.ExitStack()
        self.bar = self.status = None

    def _calibrating(self, what: str) -> None:
        self._stop()
        if not console.is_terminal:  # no spinner where output goes to a file or a pipe
            console.print(f"calibrating: {what} (first use on this machine; cached after)")
        if what.startswith("profiling"):  # the plain profile, or a compiled one's
            self.bar = self.stack.enter_context(progress())
            self.task = self.bar.add_task(f"calibrating: {what}", total=None)
        else:
            self.status = self.stack.enter_context(console.status(f"calibrating: {what}"))

    def _profiling(self, label: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=f"profiling {label}")

    def _validating(self, r: int, pred: Prediction) -> None:
        if self.status is None:
            self._stop()
            self.status = self.stack.enter_context(console.status("validating"))
        self.status.update(f"validating {pred.strategy.label()} (round {r + 1})")
        if not console.is_terminal:
            console.print(f"validating {pred.strategy.label()} (round {r + 1})")

    def _calibrated(self, profile: Profile, psource: str, cluster: Cluster, csource: str) -> None:
        self._stop()
        if psource == "shipped":
            console.print(
                f"profile: pipecast's reference, measured on {profile.device} at micro-batches "
                f"{list(profile.micro_batch_sizes)} ({profile.dtype}, torch "
                f"{profile.torch_version}; host costs the mean of {profile.host.pooled} runs' "
                "profiles)"
            )
        else:
            pooled = (
                f"; host costs the mean of {profile.host.pooled} profiles of it here"
                if profile.host.pooled > 1 and psource != "given"
                else ""
            )
            console.print(
                f"profile: {psource} on {profile.device} at micro-batches "
                f"{list(profile.micro_batch_sizes)}{pooled}"
            )
        if csource == "preset":
            console.print(
                f"cluster: {cluster.world} x {cluster.device} ({cluster.name}), predicted from "
                "pipecast's own profiles of that GPU; --device cpu plans for this machine's "
                "CPU ranks instead"
            )
        else:
            console.print(
                f"cluster: {csource} {cluster.world} x {cluster.device}, "
                f"{human_bytes(cluster.memory_bytes)}"
                + (" of host memory per rank (its share)" if cluster.device == "cpu" else " each")
            )
