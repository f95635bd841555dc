"""`pipecast simulate`: predict a schedule's step time, bubble and memory; draw it."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table

from pipecast import jsonio
from pipecast.cli.common import (
    MICRO_BATCHES_HELP,
    RECOMPUTE_HELP,
    SHARD_OPTIMIZER_HELP,
    add_virtual_arg,
    count_arg,
    output_dir,
    schedule_arg,
)
from pipecast.cli.console import console, human_bytes, human_seconds
from pipecast.cli.planning import add_profile_args, default_batch, load_inputs
from pipecast.planning.recommend.predict import Prediction, predict
from pipecast.planning.recommend.rank import samples_rate
from pipecast.planning.schedules.generators import SCHEDULES
from pipecast.planning.simulation import closed_form
from pipecast.planning.simulation.bounds import check_simulable
from pipecast.report.trace import write_trace
from pipecast.values.hardware.units import per_rank
from pipecast.values.models.sources import file_stem
from pipecast.values.strategy import Kind, Strategy
from pipecast.values.training import RECOMPUTES


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "simulate",
        help="predict step time, bubble and per-GPU memory of a pipeline schedule",
        description="Partition the profiled model, generate the schedule's plan and simulate "
        "it event by event. Prints step time, bubble and memory per rank; writes a Gantt "
        "chart PNG and a Chrome/Perfetto trace.",
    )
    add_profile_args(p)
    p.add_argument("--stages", type=count_arg("--stages", 1), required=True, help="pipeline GPUs")
    p.add_argument("--schedule", type=schedule_arg, default="1f1b", help=", ".join(SCHEDULES))
    add_virtual_arg(p)
    p.add_argument(
        "--micro-batches",
        type=count_arg("--micro-batches", 1),
        default=8,
        help=MICRO_BATCHES_HELP,
    )
    p.add_argument(
        "--batch",
        type=count_arg("--batch", 1),
        help="global batch (default: largest profiled micro-batch x micro-batches)",
    )
    p.add_argument("--partition", default="balanced", help="method or boundaries 0,4,10,40")
    p.add_argument(
        "--replicas",
        type=count_arg("--replicas", 1),
        default=1,
        help="data-parallel pipeline replicas",
    )
    p.add_argument("--shard-optimizer", action="store_true", help=SHARD_OPTIMIZER_HELP)
    p.add_argument("--recompute", choices=RECOMPUTES, default="none", help=RECOMPUTE_HELP)
    p.add_argument(
        "--compare-closed-form",
        action="store_true",
        help="also print the background studies' closed-form predictions",
    )
    p.add_argument(
        "--out-dir", type=output_dir, default="pipecast-out", help="where the PNG and trace go"
    )
    p.set_defaults(func=run)


def _outputs(args: argparse.Namespace, model: str) -> tuple[Path, Path]:
    """The Gantt chart and the trace a simulation writes into --out-dir."""
    virtual = f"-v{args.virtual_stages}" if args.virtual_stages else ""
    stem = f"{file_stem(model)}-{args.schedule}{virtual}-{args.stages}x{args.micro_batches}"
    out = Path(args.out_dir)
    return out / f"{stem}.png", out / f"{stem}.trace.json"


def print_prediction(pred: Prediction) -> None:
    t = pred.timeline
    console.print(
        f"[bold]{pred.strategy.label()}[/], batch {pred.batch} "
        f"(micro-batch {pred.micro_batch}), partition {pred.partition.boundaries}"
    )
    console.print(
        f"step {human_seconds(t.step_time)}  |  {samples_rate(pred.samples_per_second)} "
        f"samples/s  |  bubble {t.bubble_fraction:.1%}  |  exposed communication "
        f"{human_seconds(t.exposed_comm)}"
    )
    table = Table()
    for col in ("rank", "busy", "idle", "peak memory"):
        table.add_column(col, justify="right")
    for r in range(t.num_ranks):
        table.add_row(
            str(r),
            human_seconds(t.busy[r]),
            human_seconds(t.idle[r]),
            human_bytes(t.peak_memory[r]),
        )
    console.print(table)
    if not pred.fits:
        console.print(
            f"[red]does not fit: {human_bytes(pred.peak_memory)} > "
            f"{human_bytes(pred.memory_limit)} usable {per_rank(pred.cpu)}[/]"
        )


def run(args: argparse.Namespace) -> int:
    profile, cluster = load_inputs(args, args.stages * args.replicas)
    chart, trace = _outputs(args, profile.model)
    for path in (chart, trace):  # before the simulation: what is there is not replaced
        jsonio.check_output(path)
    kind: Kind = "pipeline" if args.replicas == 1 else "hybrid"
    strategy = Strategy(
        kind=kind,
        stages=args.stages,
        replicas=args.replicas,
        schedule=args.schedule,
        virtual=args.virtual_stages,
        microbatches=args.micro_batches,
        partition=args.partition,
        recompute=args.recompute,
        shard_optimizer=args.shard_optimizer,
    )
    check_simulable(args.schedule, args.stages, args.micro_batches, args.virtual_stages)
    batch = args.batch or default_batch(profile, args.micro_batches * args.replicas)
    pred = predict(
        profile,
        cluster,
        strategy,
        batch,
        optimizer=args.optimizer,
        memory_margin=args.memory_margin,
        uneven=True,  # as train runs it (values.batching.check_batch)
    )
    if args.cluster:
        console.print(f"cluster: {args.cluster}")
    else:  # the CPU preset knows no host costs: CPU ranks are mostly host
        unpriced = " (it counts no host cost per action)" if cluster.device == "cpu" else ""
        console.print(
            f"cluster: the {cluster.name} preset{unpriced}, not this machine's readings: "
            "`pipecast probe -o c.json`, then --cluster c.json"
        )
    print_prediction(pred)
    if (batch // args.replicas) % args.micro_batches:
        console.print(
            f"batch {batch} splits into micro-batches of {pred.micro_batch - 1} and "
            f"{pred.micro_batch} samples, as train splits it: each priced at {pred.micro_batch}"
        )
    from pipecast.report.gantt import gantt

    gantt(pred.timeline, str(chart), title=f"{profile.model} {pred.strategy.label()}")
    write_trace(str(trace), ("predicted", pred.timeline))
    console.print(f"wrote {chart} and {trace.name}")
    if args.compare_closed_form:
        _closed_forms(pred, args.micro_batches)
    return 0


def _closed_forms(pred: Prediction, m: int) -> None:
    stage_events: dict[int, float] = {}
    for e in pred.timeline.events:
        if e.kind in ("F", "BW", "B", "W") and e.mb == 0:
            stage_events[e.stage] = stage_events.get(e.stage, 0.0) + e.duration
    times = [stage_events[s] for s in sorted(stage_events)]
    transfers = [
        e.duration
        for e in pred.timeline.events
        if e.kind == "send" and e.mb == 0 and e.name.split()[1][1:].startswith("F")
    ]
    stages = len(times)
    # the recommender study's T_seq: one GPU running the batch's micro-batches in turn
    t_seq = m * sum(times)
    study = closed_form.gpipe_compute(t_seq, stages, m)
    if stages > 1 and len(transfers) == stages - 1:
        study += closed_form.lockstep_links(transfers, m)  # each already L + mb A / BW
    console.print(
        f"closed forms: GPipe study "
        f"{human_seconds(closed_form.gpipe_study(times, transfers, m))}, "
        f"recommender study eq. 6.1 + 6.2 {human_seconds(study)}, "
        f"(m + K - 1) x slowest {human_seconds(closed_form.fill_drain(times, m))}, "
        f"simulator {human_seconds(pred.step_time)}"
    )
