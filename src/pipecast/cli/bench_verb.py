"""`pipecast bench`: run a benchmark suite into the results store (resumable)."""

from __future__ import annotations

import argparse

from rich.table import Table

from pipecast.cli.common import count_arg, number_arg
from pipecast.cli.console import console, human_seconds, progress
from pipecast.cli.paths import store_file
from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.inputs import basis_for
from pipecast.orchestration.bench.predictions import predictions
from pipecast.orchestration.bench.runner import run_suite
from pipecast.orchestration.bench.suites import SUITES, suite
from pipecast.values.hardware.load import load_cluster


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench",
        help="run a benchmark suite (pipecast against its baselines)",
        description="Run every configuration of a suite with pipecast's runtime "
        "and, in the same launch, single-device, DDP and torch.distributed."
        "pipelining baselines. Results go to a SQLite store as each completes; "
        "rerunning resumes where it stopped.",
    )
    p.add_argument("--suite", default="quick", help=", ".join(SUITES))
    p.add_argument(
        "--store",
        type=store_file,
        default="pipecast-out/bench.sqlite",
        help="the SQLite results store each configuration's row goes to as it completes; "
        "a suite rerun on it skips the rows it holds (default: pipecast-out/bench.sqlite)",
    )
    p.add_argument("--cluster", help="cluster for the predicted columns (default: a preset)")
    p.add_argument(
        "--timeout",
        type=number_arg("--timeout", above=True),
        default=300.0,
        help="seconds per configuration",
    )
    p.add_argument(
        "--rounds",
        type=count_arg("--rounds", 1),
        default=1,
        help="measure the whole suite this many times, each configuration keeping the median "
        "of its rounds (the host's speed moves between minutes; default 1)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    configs = suite(args.suite)
    if args.cluster:
        load_cluster(args.cluster)  # a bad file before profiling, not after
    with console.status("profiling the suite's workloads for the predicted columns") as status:
        basis = basis_for(configs, args.cluster, progress=status.update)
    predicted = predictions(configs, basis.profiles, basis.cluster, basis.describe) if basis else {}
    with progress() as bar:
        task = bar.add_task(f"suite {args.suite}", total=len(configs))
        store = run_suite(
            configs,
            args.store,
            predicted=predicted,
            timeout_s=args.timeout,
            on_progress=lambda done, total: bar.update(task, completed=done),
            rounds=args.rounds,
        )
    table = Table(title=f"suite {args.suite}: {args.store}")
    for col in ("configuration", "status", "step", "samples/s", "predicted", "top-1 error"):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    keys = {c.key for c in configs}
    for row in store.rows(suite=args.suite):
        if row.key not in keys:
            continue
        cfg = BenchConfig.from_dict(row.config)
        m, p = row.measured or {}, row.predicted or {}
        err = m.get("top1_error")
        table.add_row(
            cfg.label(),
            row.status if row.status == "ok" else f"[red]{row.status}[/]",
            human_seconds(m["step_time"]) if "step_time" in m else "",
            f"{m['samples_per_second']:,.1f}" if "samples_per_second" in m else "",
            human_seconds(p["step_time"]) if "step_time" in p else "",
            f"{err:.1%}" if err is not None else "",
        )
    console.print(table)
    return 0
