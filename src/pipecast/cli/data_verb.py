"""`pipecast data`: list data sets, or read one from disk and summarise it."""

from __future__ import annotations

import argparse

from rich.table import Table

from pipecast.cli.console import console
from pipecast.values.data.registry import DESCRIPTIONS, get_spec
from pipecast.values.data.source import load_real


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "data",
        help="list data sets, or check real data on disk",
        description="Without --dataset: the data sets and their shapes. With --dataset "
        "digits, or mnist/cifar10 and --data-dir: read the samples and summarise them.",
    )
    p.add_argument("--dataset", help="digits, or mnist/cifar10 with --data-dir")
    p.add_argument("--data-dir", help="directory with MNIST IDX files or CIFAR-10 batches")
    p.add_argument("--test-split", action="store_true", help="read the test split")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.dataset is None:
        table = Table(title="data sets")
        table.add_column("name")
        table.add_column("shape")
        table.add_column("about")
        for name, about in DESCRIPTIONS.items():
            table.add_row(name, get_spec(name).describe(), about)
        console.print(table)
        return 0
    data = load_real(args.dataset, args.data_dir, train=not args.test_split)
    counts = data.targets.bincount().tolist()
    console.print(
        f"{args.dataset}: {len(data)} samples of shape {tuple(data.inputs.shape[1:])}, "
        f"{len(counts)} classes, per-class counts {counts}"
    )
    return 0
