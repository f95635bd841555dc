"""`pipecast infer`: pipelined inference (a forward-only plan)."""

from __future__ import annotations

import argparse

from pipecast.cli.run_args import add_run_args
from pipecast.cli.train_verb import run


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "infer",
        help="pipelined inference: samples/s and latency",
        description="Run forward-only pipelined inference and report throughput and batch latency.",
    )
    add_run_args(p, inference=True)
    p.set_defaults(func=run, inference=True)
