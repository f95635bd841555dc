"""`pipecast recommend`: the fastest way to train a model on your GPUs, before you spend them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from rich.table import Table

from pipecast import jsonio
from pipecast.cli.common import (
    add_workload_args,
    count_arg,
    margin_arg,
    methods_arg,
    workload_from_args,
)
from pipecast.cli.console import console, human_bytes, human_seconds, progress
from pipecast.data.registry import epoch_samples
from pipecast.errors import ConfigError
from pipecast.hardware import devices, hostspeed
from pipecast.hardware.load import load_cluster
from pipecast.hardware.presets import gpu_kind
from pipecast.models.workload import Workload
from pipecast.profile.reference import UNNAMED, carries, label, reference_profile, shipped
from pipecast.profile.types import Profile
from pipecast.recommender.calibrate import calibrated_cluster, calibrated_profile, profile_sizes
from pipecast.recommender.host_drift import HostDrift, host_drift
from pipecast.recommender.measure import Measured, decide, measure_rounds, too_close
from pipecast.recommender.predict import Prediction
from pipecast.recommender.rank import Recommendation, recommend, samples_rate
from pipecast.runtime.config import RunConfig


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "recommend",
        help="rank single-GPU, data-parallel, pipeline and hybrid strategies; pick the fastest",
        description="Predict every strategy's step time and per-GPU memory with the simulator "
        "(from a cached profile and probe of this machine, measured on first use), drop what "
        "does not fit, rank the rest and explain the winner. --validate K runs the top K.",
    )
    add_workload_args(p, required=False)
    p.add_argument(
        "--batch",
        type=int,
        default=0,
        help="global batch per step (default: 256 on GPUs, 32 on CPU)",
    )
    p.add_argument("--gpus", type=int, default=0, help="GPUs (default: all here, or 4)")
    p.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="where to profile (auto: cuda if present)",
    )
    p.add_argument(
        "--dtype",
        choices=("fp32", "bf16", "fp16"),
        help="default: bf16 where the strategies run on GPUs, fp32 on CPU ranks",
    )
    p.add_argument("--autocast", action="store_true")
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
    p.add_argument("--optimizer", choices=("sgd", "momentum", "adam"), default="sgd")
    p.add_argument(
        "--memory-margin",
        type=margin_arg,
        default=0.1,
        help="fraction of GPU memory kept free (default 0.1)",
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
        action="store_true",
        help="also rank every strategy the runtime can replay as CUDA graphs (GPU; predicted "
        "from eager device times, so less sure: use with --validate)",
    )
    p.add_argument("--top", type=count_arg("--top", 1), default=12, help="rows to show")
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
    p.add_argument("-o", "--output", default="pipecast-out/recommendation.json")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.cuda_graphs and args.validate and device != "cuda":
        raise ConfigError(
            "--cuda-graphs with --validate would run CUDA graphs, which need GPUs: "
            "drop --validate to rank them here"
        )
    if args.recalibrate and args.profile:
        raise ConfigError(
            "--recalibrate measures a new profile and --profile gives one: drop one of them"
        )
    cluster = load_cluster(args.cluster) if args.cluster else None
    here = devices.name(devices.resolve(device))
    # where the strategies will run: here, or on the devices a cluster file or preset names
    target = cluster.device if cluster is not None else here
    on_gpus = device == "cuda" or target not in (*UNNAMED, "cpu")
    elsewhere = not carries(here, target)
    if args.model is None:  # a sensible default: ResNet-50 on GPUs, a small job on a CPU
        args.model, args.dataset = ("resnet50", "imagenet") if on_gpus else ("resnet18", "cifar10")
    args.dtype = args.dtype or ("bf16" if on_gpus else "fp32")
    args.batch = args.batch or (256 if on_gpus else 32)
    workload = workload_from_args(args)
    gpus = args.gpus or (
        torch.cuda.device_count() if device == "cuda" else cluster.world if cluster else 4
    )
    if gpus < 1:
        raise ConfigError(f"--gpus must be at least 1, got {gpus}")
    if elsewhere and args.validate:
        raise ConfigError(
            f"--validate measures strategies here ({here}), but they are predicted for "
            f"{target}: drop --validate, or run it on that machine"
        )
    check_host = False  # a profile measured just now needs no check of the host's speed
    if args.profile:
        profile = Profile.load(args.profile)
        check_host = True
    elif elsewhere:
        profile = _reference(workload, args.dtype, args.autocast, target, here)
        console.print(
            f"profile: pipecast's reference, measured on {profile.device} at micro-batches "
            f"{list(profile.micro_batches)} ({profile.dtype}, torch {profile.torch_version}; "
            f"host costs the mean of {profile.host_pooled} runs' profiles)"
        )
    else:
        sizes = profile_sizes(args.batch, gpus)
        with progress() as bar:
            task = bar.add_task("calibrating: profiling", total=None)
            profile, cached = calibrated_profile(
                workload,
                sizes,
                device=device,
                dtype=args.dtype,
                autocast=args.autocast,
                progress=lambda label: bar.update(
                    task, advance=1, description=f"profiling {label}"
                ),
                refresh=args.recalibrate,
                ranks=gpus,
                batch=args.batch,
            )
        check_host = cached
        pooled = (
            f"; host costs the mean of {profile.host_pooled} profiles of it here"
            if profile.host_pooled > 1
            else ""
        )
        console.print(
            f"profile: {'cached' if cached else 'measured'} on {profile.device} at "
            f"micro-batches {list(profile.micro_batches)}{pooled}"
        )
    if cluster is None:
        with console.status("calibrating: probing links"):
            cluster, cached = calibrated_cluster(gpus, device, refresh=args.recalibrate)
        console.print(
            f"cluster: {'cached' if cached else 'probed'} {cluster.world} x "
            f"{cluster.device}, {cluster.memory_bytes / 2**30:.1f} GiB each"
        )
    if args.cuda_graphs and not profile.graph_times:
        why = f": {profile.graph_failure}" if profile.graph_failure else ""
        console.print(
            "[yellow]graphed strategies are predicted from eager device times: the profile "
            f"has no graph replay times{why}[/]"
        )
    epoch = args.epoch_samples or epoch_samples(workload.dataset)
    rec = recommend(
        profile,
        cluster,
        args.batch,
        gpus=gpus,
        optimizer=args.optimizer,
        memory_margin=args.memory_margin,
        epoch_samples=epoch,
        methods=args.methods,
        cuda_graphs=args.cuda_graphs,
    )
    print_recommendation(rec, args.top)
    if elsewhere and len(rec.close_calls()) > 1:
        console.print(
            f"[yellow]predicted for {target}, not measured here: "
            "--validate auto on that machine decides the close calls[/]"
        )
    drift = None
    if check_host:
        drift = host_drift(
            profile.host_reference,
            hostspeed.reference(),
            profiled_on=profile.host_machine,
            here=hostspeed.machine(),
            cached=not args.profile,
        )
    if drift is not None and (note := drift.note(any(p.host_bound for p in rec.close_calls()))):
        console.print(f"[yellow]{note}[/]")
    measured: list[Measured] = []
    if args.validate:
        config = RunConfig(dtype=args.dtype, autocast=args.autocast, optimizer=args.optimizer)
        local = torch.cuda.device_count() if device == "cuda" else 8
        pool = rec.close_calls() if args.validate == "auto" else rec.ranked
        limit = len(pool) if args.validate == "auto" else int(args.validate)
        runnable = [p for p in pool if p.strategy.gpus <= local][:limit]
        with console.status("validating") as status:

            def announce(r: int, pred: Prediction) -> None:
                status.update(f"validating {pred.strategy.label()} (round {r + 1}/{args.rounds})")

            measured = measure_rounds(
                runnable,
                workload,
                device=device,
                config=config,
                rounds=args.rounds,
                progress=announce,
            )
        print_validation(measured)
    about = {
        "workload": workload.to_dict(),
        "device": "cuda" if on_gpus else "cpu",
        "dtype": args.dtype,
        "autocast": args.autocast,
        "optimizer": args.optimizer,
        # what the predictions were made from
        "profile": {
            "device": profile.device,
            "micro_batches": list(profile.micro_batches),
            "torch": profile.torch_version,
            "host_pooled": profile.host_pooled,
        },
    }
    _write(args.output, rec, measured, drift, about)
    where = f" on {gpus} x {target}" if elsewhere else ""
    console.print(f"run it{where}: pipecast train --recommendation {args.output} --steps 100")
    return 0


def _reference(
    workload: Workload, dtype: str, autocast: bool, cluster_device: str, here: str
) -> Profile:
    """The shipped profile for a cluster of GPUs this machine does not have, or a
    ConfigError that says what to do instead."""
    found = None if autocast else reference_profile(workload, dtype, cluster_device)
    if found is not None:
        return found
    kind = gpu_kind(cluster_device) or ""
    ships = ", ".join(label(p) for p in shipped(kind)) if kind else ""
    raise ConfigError(
        f"the cluster's devices are {cluster_device} but this machine would profile on "
        f"{here}, whose times do not carry to them: profile it on that GPU (pipecast profile "
        f"--model {workload.model} --dataset {workload.dataset} --dtype {dtype} --micro-batch "
        "8,16,32,64 --device cuda -o p.json) and pass --profile p.json"
        + (f"; pipecast ships {kind.upper()} profiles of {ships}" if ships else "")
    )


def print_recommendation(rec: Recommendation, top: int) -> None:
    table = Table(
        title=f"strategies for batch {rec.batch}, fastest first "
        f"({len(rec.ranked)} fit, {len(rec.rejected)} do not; an epoch is "
        f"{rec.epoch_samples:,} samples)"
    )
    # the host's share only means something where a host issues work to a device
    host = any(p.timeline.host_share > 0 for p in rec.ranked[:top])
    memory = "peak memory/" + ("rank" if rec.ranked and rec.ranked[0].cpu else "GPU")
    columns = ["#", "strategy", "step", "samples/s", "epoch", memory, "bubble", "comm"]
    for col in columns + (["host"] if host else []):
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for i, pred in enumerate(rec.ranked[:top], 1):
        t = pred.timeline
        cells = [
            str(i),
            pred.strategy.label(),
            human_seconds(pred.step_time),
            samples_rate(pred.samples_per_second),
            human_seconds(rec.epoch_time(pred)),
            human_bytes(pred.peak_memory),
            f"{t.bubble_fraction:.0%}",
            f"{pred.comm_fraction:.0%}",
        ]
        if host:
            cells.append(f"{t.host_share:.0%}" + (" bound" if pred.host_bound else ""))
        table.add_row(*cells)
    console.print(table)
    for r in rec.rejected[:3]:
        console.print(f"[dim]does not fit: {r.strategy.label()}: {r.reason}[/]")
    console.print(f"[bold green]recommendation:[/] {rec.reason()}")


def print_validation(measured: list[Measured]) -> None:
    table = Table(title="validation: predicted against measured")
    for col in ("strategy", "predicted", "measured", "error", "run to run"):
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for m in measured:
        table.add_row(
            m.prediction.strategy.label(),
            human_seconds(m.prediction.step_time),
            human_seconds(m.step_time),
            f"{m.error:+.1%}",
            f"{m.spread:.0%}" if len(m.rounds) > 1 else "",
        )
    console.print(table)
    if measured:
        console.print(
            f"[bold green]measured fastest:[/] {decide(measured).prediction.strategy.label()}"
        )
        spread = too_close(measured)
        if spread is not None:
            console.print(
                f"[yellow]the two fastest differ by less than their run-to-run spread "
                f"({spread:.0%}): on this machine either will do[/]"
            )


def _entry(p: Prediction, rec: Recommendation) -> dict[str, Any]:
    return {
        "strategy": p.strategy.to_dict(),
        "label": p.strategy.label(),
        "step_time": p.step_time,
        "samples_per_second": p.samples_per_second,
        "epoch_time": rec.epoch_time(p),
        "comm": p.comm_fraction,
        "peak_memory": p.peak_memory,
        "bubble": p.timeline.bubble_fraction,
        "host_share": p.timeline.host_share,
        "host_bound": p.host_bound,
        "likely_measured": list(p.measured_range),
        "partition": p.partition.boundaries,
    }


def _write(
    path: str,
    rec: Recommendation,
    measured: list[Measured],
    drift: HostDrift | None,
    about: dict[str, Any],
) -> None:
    """The recommendation as JSON: `about` (the workload and precision it was made for), the
    ranking, and under "run" the strategy `pipecast train --recommendation` runs: the
    measured fastest where it validated, else the predicted fastest."""
    run = decide(measured).prediction if measured else rec.best
    doc = {
        **about,
        "batch": rec.batch,
        "recommended": rec.best.strategy.to_dict(),
        "reason": rec.reason(),
        "run": {**_entry(run, rec), "why": "measured fastest" if measured else "predicted fastest"},
        "epoch_samples": rec.epoch_samples,
        "ranked": [_entry(p, rec) for p in rec.ranked],
        "rejected": [{"label": r.strategy.label(), "reason": r.reason} for r in rec.rejected],
        "validation": [
            {
                "label": m.prediction.strategy.label(),
                "predicted": m.prediction.step_time,
                "measured": m.step_time,
                "error": m.error,
                "rounds": list(m.rounds),
                "spread": m.spread,
            }
            for m in measured
        ],
        # hostspeed.reference() seconds as profiled and now (absent: profiled just now)
        "host_speed": drift.to_dict() if drift is not None else None,
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    jsonio.write_atomic(path, json.dumps(doc, indent=1))
    console.print(f"written to {path}")
