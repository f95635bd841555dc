"""`pipecast <verb>`: verbs are registered here, one module each."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib import import_module
from typing import NoReturn

from pipecast import __version__
from pipecast.errors import PipecastError

# Each module exposes register(subparsers); the order is the order of `pipecast --help`.
VERBS: tuple[str, ...] = (
    "models",
    "data",
    "profile",
    "probe",
    "partition",
    "simulate",
    "train",
    "infer",
    "recommend",
    "bench",
    "report",
)

_MODULES = {verb: f"pipecast.cli.{verb}_verb" for verb in VERBS}


class _Parser(argparse.ArgumentParser):
    """argparse, its errors one line (`pipecast <verb>: error: ...`) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (--help for usage)", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pipecast",
        description="Profile, partition, schedule, simulate, recommend and run pipeline-"
        "parallel training.",
    )
    parser.add_argument("--version", action="version", version=f"pipecast {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="<verb>")
    for verb in VERBS:
        import_module(_MODULES.get(verb, f"pipecast.cli.{verb}")).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0
    try:
        return func(args)
    except PipecastError as exc:
        print(f"pipecast: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pipecast: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
