"""The terminal: one rich Console for tables and progress bars."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

# re-exported: the verbs print sizes as the planning layer's messages do
from pipecast.values.hardware.units import human_bytes as human_bytes

# Piped into a file or a CI log there is no terminal to size to; rich would assume 80 columns
# and wrap every strategy name, so such output gets room for a full table row.
console = Console(width=None if sys.stdout.isatty() else 140)
err_console = Console(stderr=True)


def progress(*, note: bool = False) -> Progress:
    """A progress bar on stderr, so that stdout stays clean for tables and JSON. `note`: a
    `note` field after the count (every task must give one) and the time remaining."""
    extra: list[ProgressColumn] = [TextColumn("{task.fields[note]}")] if note else []
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        *extra,
        TimeElapsedColumn(),
        *([TimeRemainingColumn()] if note else []),
        console=err_console,
        transient=not sys.stderr.isatty(),
        disable=False,
    )


def human_count(n: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"


def human_seconds(s: float) -> str:
    """A duration as people read it: µs and ms for steps, s, min and h for epochs."""
    if s >= 60:
        whole = round(s)
        if whole >= 3600:
            hours, minutes = divmod(round(whole / 60), 60)
            return f"{hours} h {minutes:02d} min"
        minutes, rest = divmod(whole, 60)
        return f"{minutes} min {rest:02d} s"
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} µs"


def counted(n: int, one: str, many: str = "") -> str:
    """'1 micro-batch', '4 micro-batches': `n` with the word for one or for many (`one` + 's'
    where `many` is not given)."""
    return f"{n} {one if n == 1 else many or one + 's'}"
