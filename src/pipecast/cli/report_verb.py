"""`pipecast report`: the results store as an HTML and Markdown report with plots."""

from __future__ import annotations

import argparse

from pipecast.cli.common import output_dir
from pipecast.cli.console import console
from pipecast.values.hardware.load import load_cluster


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "report",
        help="render the results store as HTML and Markdown with plots",
        description="Tables and plots from a benchmark store: speed-ups, the "
        "GPipe study's micro-batch figures, predicted against measured, training "
        "accuracy, per-block profiles and partition efficiency, communication "
        "against tensor size, and whether the background observations hold.",
    )
    p.add_argument("--store", default="pipecast-out/bench.sqlite")
    p.add_argument("--profile", action="append", default=[], help="profile JSON to include")
    p.add_argument("--probe", help="raw probe samples (pipecast probe --raw)")
    p.add_argument("--cluster", help="cluster for partition efficiency tables")
    p.add_argument("--trace", action="append", default=[], help="trace JSON to link")
    p.add_argument("-o", "--out-dir", type=output_dir, default="pipecast-out/report")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pipecast.errors import DataError

    if not Path(args.store).exists():
        raise DataError(f"no results store at {args.store}: run `pipecast bench` first")
    cluster = load_cluster(args.cluster) if args.cluster else None
    from pipecast.report.html import build

    page, md = build(
        args.store,
        args.out_dir,
        profiles=args.profile,
        probe=args.probe,
        cluster=cluster,
        traces=args.trace,
    )
    console.print(f"report: {page} and {md}")
    return 0
