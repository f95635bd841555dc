"""`pipecast <verb>`: verbs are registered here, one module each."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib import import_module
from typing import NoReturn

from pipecast import __version__
from pipecast.errors import PipecastError
from pipecast.runtime.env_defaults import default_env

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

EXIT_BAD_INPUT = 2
EXIT_CODES = (
    "exit codes: 0 done; 1 a bug (the traceback says where: please report it); 2 bad input "
    "(one line names the rule, the values and the fix); 3 a rank was lost: it died, or made "
    "no progress within --timeout (the others say where each rank was, with the plan's "
    "grid; the same command may well succeed again, with --resume from a checkpoint); "
    "130 interrupted."
)
"""What `pipecast --help` ends with. A PipecastError's code is its `exit_code`, where it has
one (pipecast.runtime.launch.RankLost: 3), else EXIT_BAD_INPUT."""


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
        epilog=EXIT_CODES,
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
    default_env()  # before anything starts CUDA in this process
    try:
        return func(args)
    except PipecastError as exc:
        print(f"pipecast: error: {exc}", file=sys.stderr)
        code: int = getattr(exc, "exit_code", EXIT_BAD_INPUT)
        return code
    except KeyboardInterrupt:
        print("pipecast: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
