"""`pipecast report`: the results store as an HTML and Markdown report with plots."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipecast.cli.common import output_file
from pipecast.cli.console import console
from pipecast.values.hardware.load import load_cluster


def page_file(text: str) -> str:
    """An argparse type for the report's page: a file to write (output_file: checked before
    anything is read or drawn) that is the HTML page, the Markdown and images beside it."""
    if Path(output_file(text)).suffix.lower() == ".md":
        raise argparse.ArgumentTypeError(
            f"{text} names the Markdown: name the HTML page (e.g. report.html); report.md "
            "is written beside it"
        )
    return text


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "report",
        help="render the results store as HTML and Markdown with plots",
        description="Tables and plots from a benchmark store: speed-ups, the "
        "GPipe study's micro-batch figures, predicted against measured, training "
        "accuracy, per-block profiles and partition efficiency, communication "
        "against tensor size, and whether the background observations hold.",
    )
    p.add_argument(
        "--store",
        default="pipecast-out/bench.sqlite",
        help="the results store `pipecast bench` wrote (default: pipecast-out/bench.sqlite)",
    )
    p.add_argument("--profile", action="append", default=[], help="profile JSON to include")
    p.add_argument("--probe", help="raw probe samples (pipecast probe --raw)")
    p.add_argument("--cluster", help="cluster for partition efficiency tables")
    p.add_argument("--trace", action="append", default=[], help="trace JSON to link")
    p.add_argument(
        "-o",
        "--output",
        type=page_file,
        default="pipecast-out/report.html",
        help="the HTML page to write; the Markdown goes beside it (report.md for "
        "report.html) and the images into a folder beside them (report_files/)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pipecast.orchestration.bench.store import Store

    store = Store(args.store, read_only=True)  # a missing or foreign store: one line, here
    cluster = load_cluster(args.cluster) if args.cluster else None
    from pipecast.report.html import build

    page, md = build(
        store,
        args.output,
        profiles=args.profile,
        probe=args.probe,
        cluster=cluster,
        traces=args.trace,
    )
    console.print(f"report: {page} and {md}")
    return 0
