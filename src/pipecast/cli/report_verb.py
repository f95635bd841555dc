"""`pipecast report`: the results store, or a run's trace, as an HTML and Markdown report
with plots."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipecast.cli.common import output_file
from pipecast.cli.console import console
from pipecast.cli.paths import why_unwritable
from pipecast.errors import DataError
from pipecast.jsonio import why_not_output
from pipecast.orchestration.bench.store import Store
from pipecast.report.page import paths
from pipecast.values.hardware.load import load_cluster

DEFAULT_STORE = "pipecast-out/bench.sqlite"
"""Where `pipecast bench` writes its store unless told otherwise."""
TRACES = "pipecast-out"
"""Where `pipecast train`, `infer` and `simulate` write their traces unless told otherwise."""


def page_file(text: str) -> str:
    """An argparse type for the report's page: a file to write (output_file: checked before
    anything is read or drawn) that is the HTML page, the Markdown and images beside it;
    those two are checked too (a regular file or a new path; a folder to write into)."""
    html, md, images = paths(output_file(text))
    if html.suffix.lower() == ".md":
        raise argparse.ArgumentTypeError(
            f"{text} names the Markdown: name the HTML page (e.g. report.html); report.md "
            "is written beside it"
        )
    why = why_not_output(md) or why_unwritable(str(images), directory=True)
    if why is not None:
        raise argparse.ArgumentTypeError(f"{why} (the report writes it beside {text})")
    return text


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "report",
        help="render the results store as HTML and Markdown with plots",
        description="Tables and plots from a benchmark store: speed-ups, the "
        "GPipe study's micro-batch figures, predicted against measured, training "
        "accuracy, per-block profiles and partition efficiency, communication "
        "against tensor size, and whether the background observations hold; and of "
        "the runs whose traces --trace names (a Gantt chart each, with the prediction "
        "beside it), which need no store.",
    )
    p.add_argument(
        "--store",
        help="the results store `pipecast bench` wrote (default: pipecast-out/bench.sqlite "
        "where it exists; without one the report holds the files named below)",
    )
    p.add_argument("--profile", action="append", default=[], help="profile JSON to include")
    p.add_argument("--probe", help="raw probe samples (pipecast probe --raw)")
    p.add_argument("--cluster", help="cluster for partition efficiency tables")
    p.add_argument(
        "--trace",
        action="append",
        default=[],
        help="a run's trace (`pipecast train` writes pipecast-out/MODEL-SCHEDULE-N.measured."
        "trace.json) to chart and link; repeatable",
    )
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
    store = _store(args)  # a missing or foreign store: one line, here
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


def _store(args: argparse.Namespace) -> Store | None:
    """The store named, else the default one where it exists; None where there is none and
    the report has files of its own to show; else a one-line DataError saying what a report
    needs and the command that makes it."""
    if args.store is not None:
        return Store(args.store, read_only=True)
    if Path(DEFAULT_STORE).exists():
        return Store(DEFAULT_STORE, read_only=True)
    if args.trace or args.profile or args.probe:
        return None
    raise DataError(
        f"nothing to report: no results store at {DEFAULT_STORE} and no --trace, --profile "
        f"or --probe: report a run with `pipecast report --trace {_newest_trace()}`, or run "
        "`pipecast bench` first (or name its store with --store)"
    )


def _newest_trace() -> str:
    """The trace the last run here wrote, for the hint (a placeholder where there is none)."""
    traces = sorted(Path(TRACES).glob("*.trace.json"), key=lambda p: p.stat().st_mtime)
    return str(traces[-1]) if traces else f"{TRACES}/MODEL-SCHEDULE-N.measured.trace.json"
