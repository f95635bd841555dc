"""How long a measuring thread waited for a core while something was measured.

[Note: a shared host] CPU ranks compute on the host's cores, and so does everything else the
machine runs. Where other processes keep the cores busy, ranks step several times as slowly
as one rank alone, one rank's steps move from one to the next, and a profile taken a minute
before the runs describes another machine than the one they ran on (docs/decisions.md,
"Rows that waited for a core"). Such a row is not measured like its prediction's inputs.
The kernel counts, per thread, the time it was ready to run but waited for a core
(/proc/thread-self/schedstat, the run-queue delay): the bench reads the computing thread's
around every row in every rank and around the profile, and the report leaves out of its
accuracy every row whose ranks, or whose profile, waited for a core more than WAIT_LIMIT of
the time, saying so. (What other processes take from cores the ranks leave idle costs the
ranks nothing, and is not counted.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

WAIT_LIMIT = 0.1
"""The share of a measurement's time its computing thread may have waited for a core for
it to count as measured like for like."""


def waited(schedstat: str = "/proc/thread-self/schedstat") -> float | None:
    """Seconds the calling thread has waited, ready to run, for a core (the second field
    of its schedstat, in ns; None where the kernel does not keep it). The thread that
    measures is the one that computes (a CPU rank computes on its main thread with one
    thread; with more, the main thread still runs every op); the transport's and the
    workers' own threads are not counted, so a rank's own wake-ups never read as another
    process's."""
    try:
        return int(Path(schedstat).read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class Mark:
    """Readings at the start of a measurement."""

    wall: float
    waited: float | None

    @classmethod
    def now(cls) -> Mark:
        return cls(time.monotonic(), waited())


def waited_share(start: Mark, end: Mark) -> float | None:
    """The share of the time between `start` and `end` the calling thread spent waiting
    for a core (None: not readable here)."""
    wall = end.wall - start.wall
    if start.waited is None or end.waited is None or wall <= 0:
        return None
    return max(0.0, end.waited - start.waited) / wall


def shared_reason(share: float | None, who: str) -> str | None:
    """Why a measurement is not like for like: `who` waited for a core more than
    WAIT_LIMIT of its time (None: it is, or nothing was read)."""
    if share is None or share <= WAIT_LIMIT:
        return None
    return (
        f"{who} waited for a core {share:.0%} of the time (more than {WAIT_LIMIT:.0%}): "
        "other processes were using the machine"
    )
