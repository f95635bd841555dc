"""`pipecast models`: the zoo, or one model's block table."""

from __future__ import annotations

import argparse

from rich.table import Table

from pipecast.cli.common import (
    add_workload_args,
    check_model_named,
    note_sizes,
    workload_from_args,
)
from pipecast.cli.console import console, human_count
from pipecast.cli.model_size import check_model_size
from pipecast.values.models.registry import ZOO
from pipecast.values.models.summary import summarize
from pipecast.values.models.workload import Workload


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "models",
        help="list the model zoo, or show one model's blocks",
        description="Without --model: every zoo model with parameters and FLOPs per sample. "
        "With --model: its block table (output shape, parameters, FLOPs) for --dataset.",
    )
    add_workload_args(p, required=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_model_named(args, "models lists the zoo, each model on its own data set")
    if args.model is None:
        table = Table(title="pipecast model zoo (FLOPs: forward, per sample)")
        for col in ("model", "default data set", "blocks", "parameters", "FLOPs", "about"):
            table.add_column(
                col, justify="right" if col in ("blocks", "parameters", "FLOPs") else "left"
            )
        for name, entry in ZOO.items():
            workload = Workload(model=name, dataset=entry.default_dataset)
            rows = summarize(workload.build("meta"), workload.spec)
            table.add_row(
                name,
                entry.default_dataset,
                str(len(rows)),
                human_count(sum(r.params for r in rows)),
                human_count(sum(r.flops for r in rows)),
                entry.description,
            )
        console.print(table)
        return 0
    workload = workload_from_args(args)
    check_model_size(workload)  # listed, not built: only its blocks count
    rows = summarize(workload.build("meta"), workload.spec)
    note_sizes(workload)
    table = Table(title=f"{workload.model} on {workload.dataset}: {workload.spec.describe()}")
    for col in ("block", "type", "output shape", "parameters", "FLOPs/sample"):
        table.add_column(col, justify="left" if col == "type" else "right")
    for r in rows:
        shape = "x".join(str(d) for d in r.output_shape) or "scalar"
        table.add_row(str(r.index), r.name, shape, f"{r.params:,}", human_count(r.flops))
    table.add_row(
        "",
        "total",
        "",
        f"{sum(r.params for r in rows):,}",
        human_count(sum(r.flops for r in rows)),
        style="bold",
    )
    console.print(table)
    return 0
