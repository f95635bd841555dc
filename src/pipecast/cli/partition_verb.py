"""`pipecast partition`: split a profiled model into balanced stages."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from pipecast import jsonio
from pipecast.cli.common import add_virtual_arg, count_arg, output_file, schedule_arg
from pipecast.cli.console import console, human_bytes, human_seconds
from pipecast.cli.paths import check_output_dir
from pipecast.cli.planning import add_profile_args, load_inputs
from pipecast.errors import ConfigError
from pipecast.planning.partition import METHODS, PartitionReport, Setting, analyze, partition
from pipecast.planning.partition.pipedream import pipedream_partition
from pipecast.values.models.sources import file_stem, library_of
from pipecast.values.plan.action import Plan
from pipecast.values.plan.torch_pipelining import (
    check_exported,
    schedule_csv,
    split_points,
    split_script,
)
from pipecast.values.profile.types import Profile

if TYPE_CHECKING:
    from pipecast.values.models import Workload


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "partition",
        help="split a profiled model into stages (balanced, or a baseline method)",
        description="Split the blocks of a profiled model into contiguous stages. The default "
        "'balanced' minimises the slowest stage counting forward + backward, boundary "
        "transfers and memory; --compare shows every method side by side.",
    )
    add_profile_args(p)
    p.add_argument("--stages", type=count_arg("--stages", 1), required=True, help="pipeline stages")
    p.add_argument("--method", default="balanced", help=f"{', '.join(METHODS)} or pipedream")
    p.add_argument(
        "--micro-batch",
        type=count_arg("--micro-batch", 1),
        help="samples per micro-batch (default: largest profiled)",
    )
    p.add_argument(
        "--micro-batches",
        type=count_arg("--micro-batches", 1),
        default=8,
        help="micro-batches per step (memory)",
    )
    p.add_argument(
        "--schedule",
        type=schedule_arg,
        default="1f1b",
        help="the schedule whose in-flight memory counts",
    )
    add_virtual_arg(p)
    p.add_argument("--compare", action="store_true", help="every method side by side")
    p.add_argument("-o", "--output", type=output_file, help="write the partition JSON here")
    p.add_argument(
        "--export",
        choices=("torch",),
        help="also write the split as torch.distributed.pipelining SplitPoints and the "
        "schedule as its CSV (into --out-dir)",
    )
    p.add_argument(
        "--out-dir", default="pipecast-out", help="where --export writes (checked with --export)"
    )
    p.set_defaults(func=run)


def print_report(report: PartitionReport) -> None:
    table = Table(title=f"{report.method}: boundaries {report.boundaries}")
    for col in ("stage", "blocks", "devices", "compute", "comm", "memory"):
        table.add_column(col, justify="right")
    for s in report.stages:
        table.add_row(
            str(s.index),
            f"{s.start}-{s.stop - 1}",
            ",".join(map(str, s.devices)),
            human_seconds(s.compute),
            human_seconds(s.comm),
            human_bytes(s.memory),
        )
    console.print(table)
    console.print(
        f"efficiency: {report.efficiency_compute:.3f} compute only, "
        f"{report.efficiency_with_comm:.3f} with communication"
    )


def run(args: argparse.Namespace) -> int:
    if args.export == "torch":  # refused before anything is computed or written
        check_output_dir(args.out_dir, "--out-dir")
        check_exported(_export_plan(args))
    profile, cluster = load_inputs(args, args.stages)
    if args.export == "torch":
        for path in _export_paths(args, profile):
            jsonio.check_output(path)
    size = args.micro_batch or max(profile.micro_batch_sizes)
    setting = Setting(
        micro_batch=size,
        microbatches=args.micro_batches,
        schedule=args.schedule,
        optimizer=args.optimizer,
        memory_margin=args.memory_margin,
    )
    if args.compare:
        table = Table(
            title=f"{profile.model}: {args.stages} stages at micro-batch {size} on {cluster.name}"
        )
        for col in ("method", "boundaries", "slowest stage", "efficiency", "with comm"):
            table.add_column(col, justify="left" if col in ("method", "boundaries") else "right")
        for method in METHODS:
            r = analyze(
                profile,
                partition(profile, cluster, args.stages, setting, method),
                cluster,
                size,
                schedule=args.schedule,
                microbatches=args.micro_batches,
                optimizer=args.optimizer,
            )
            table.add_row(
                method,
                str(r.boundaries),
                human_seconds(r.slowest),
                f"{r.efficiency_compute:.3f}",
                f"{r.efficiency_with_comm:.3f}",
            )
        console.print(table)
        return 0
    if args.method == "pipedream":
        part = pipedream_partition(profile, cluster, args.stages, size)
    else:
        part = partition(profile, cluster, args.stages, setting, args.method)
    print_report(
        analyze(
            profile,
            part,
            cluster,
            size,
            schedule=args.schedule,
            microbatches=args.micro_batches,
            optimizer=args.optimizer,
        )
    )
    if args.output:
        jsonio.write_atomic(args.output, part.to_json())
        console.print(f"partition written to {args.output}")
    if args.export == "torch":
        _export_torch(args, profile, part.boundaries)
    return 0


def _export_plan(args: argparse.Namespace) -> Plan:
    from pipecast.planning.schedules import make_plan
    from pipecast.planning.schedules.generators import stages_per_rank

    ranks = max(args.stages // stages_per_rank(args.schedule, args.virtual_stages), 1)
    return make_plan(args.schedule, ranks, args.micro_batches, virtual=args.virtual_stages)


def _export_workload(profile: Profile) -> Workload:
    from pipecast.values.models import Workload

    if not profile.workload:
        raise ConfigError("--export torch needs a profile that names its model (pipecast profile)")
    return Workload.from_dict(profile.workload)


def _export_paths(args: argparse.Namespace, profile: Profile) -> tuple[Path, Path]:
    """Where --export torch writes the schedule's CSV and the split script."""
    workload = _export_workload(profile)
    stem = Path(args.out_dir) / f"{file_stem(workload.model)}-{args.schedule}-{args.stages}"
    return stem.with_name(f"{stem.name}.schedule.csv"), stem.with_name(f"{stem.name}.split.py")


def _export_torch(args: argparse.Namespace, profile: Profile, boundaries: list[int]) -> None:
    workload = _export_workload(profile)
    begins = [getattr(b, "begins", str(i)) for i, b in enumerate(workload.build("meta"))]
    if library_of(workload.model) == "hf":  # the user holds the LM, not pipecast's wrapper
        begins = [b.removeprefix("model.") for b in begins]
    points = split_points(begins, boundaries)
    plan = _export_plan(args)
    csv, script = _export_paths(args, profile)
    jsonio.write_atomic(csv, schedule_csv(plan))
    jsonio.write_atomic(script, split_script(workload.model, points, plan, csv.name))
    console.print(f"torch.distributed.pipelining split: {script}; schedule: {csv}")
