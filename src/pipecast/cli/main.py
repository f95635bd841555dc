"""`pipecast <verb>`: verbs are registered here, one module each."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib import import_module
from typing import Any, NoReturn

from pipecast import __version__
from pipecast.errors import PipecastError
from pipecast.runtime.env_defaults import default_env
from pipecast.runtime.stopping import Stopped, stop_on_signals

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
EXIT_INTERRUPTED = 130
"""Ctrl-C: 128 + SIGINT, as a shell reports a process SIGINT ended (a signal that stops a
run, runtime.stopping.Stopped, exits 128 + its number the same way)."""
EXIT_CODES = (
    "exit codes: 0 done; 1 a bug (the traceback says where: please report it); 2 bad input "
    "(one line names the rule, the values and the fix); 3 a rank was lost: it died, or made "
    "no progress within --timeout (the others say where each rank was, with the plan's "
    "grid; the same command may well succeed again, with --resume from a checkpoint); "
    "130 interrupted (Ctrl-C); 143 stopped by SIGTERM, 129 by SIGHUP (the ranks are ended, "
    "complete checkpoints kept)."
)
"""What `pipecast --help` ends with. A PipecastError's code is its `exit_code`, where it has
one (pipecast.runtime.launch.RankLost: 3), else EXIT_BAD_INPUT."""


def refuse(message: str, prog: str = "pipecast") -> NoReturn:
    """Bad input found by argparse, as pipecast's own errors read: one line, `pipecast:
    error: ...`, exit 2; the usage argparse would print is left to `prog --help`, which the
    line names (`pipecast train --help` for a verb's option)."""
    print(f"pipecast: error: {message} ({prog} --help)", file=sys.stderr)
    raise SystemExit(EXIT_BAD_INPUT)


class _Help(argparse.HelpFormatter):
    """argparse's help, each option followed by its default where it has one that its help
    does not name already (an unset, off or empty default says nothing), and by
    '(required)' where it is."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if not action.option_strings or text == argparse.SUPPRESS:
            return action.help
        if action.required:
            return f"{text} (required)"
        default = action.default
        unset = default is None or default is False or default is argparse.SUPPRESS
        if unset or default in ([], ()) or "default" in text:
            return action.help
        if isinstance(default, list | tuple):
            default = ",".join(map(str, default))
        return f"{text} (default: {str(default).replace('%', '%%')})"


class _Parser(argparse.ArgumentParser):
    """argparse, its errors one line (`refuse`), its help with the defaults (`_Help`); each
    verb's parser is one too (argparse makes a verb's parser of its parent's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        refuse(message, self.prog)


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
    # the verb's parser leaves what it does not know to the top one, which would name
    # `pipecast --help` for it: the verb's own help lists the options it meant
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        prog = f"pipecast {args.verb}" if getattr(args, "verb", None) else "pipecast"
        refuse(f"unrecognized arguments: {' '.join(unknown)}", prog)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0
    default_env()  # before anything starts CUDA in this process
    try:
        with stop_on_signals():
            return func(args)
    except PipecastError as exc:
        print(f"pipecast: error: {exc}", file=sys.stderr)
        code: int = getattr(exc, "exit_code", EXIT_BAD_INPUT)
        return code
    except KeyboardInterrupt:
        print("pipecast: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Stopped as stop:
        print(f"pipecast: stopped by {stop.name}", file=sys.stderr)
        return stop.exit_code


if __name__ == "__main__":
    sys.exit(main())
