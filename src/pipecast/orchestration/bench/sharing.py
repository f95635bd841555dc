"""How much of the machine's CPU other processes took while something was measured.

[Note: a shared host] CPU ranks compute on the host's cores, and so does everything else the
machine runs. On a 2-core machine where other processes kept about 1.5 cores busy, two
LeNet-5 ranks each stepped 2.2-2.8x as slowly as one rank alone, one rank's steps moved by
30% from one to the next, and a profile taken a minute before the runs described another
machine than the one they ran on. Such a row is not measured like its prediction's inputs:
the bench reads the CPU time the whole machine spent (/proc/stat) less its own ranks'
(getrusage) around every row and around the profile, and the report leaves out of its
accuracy every row where others took more than OTHERS_LIMIT of the cores, saying so.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

OTHERS_LIMIT = 0.1
"""The share of the machine's cores other processes may take, on average over a row or over
the profile, for the row to count as measured like for like (0.2 of 2 cores)."""

_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
"""/proc/stat's cpu line: user, nice, system, (idle, iowait), irq, softirq, steal (guest
time is inside user and nice already). Steal, time the hypervisor ran something else on
this machine's CPUs, is taken from the processes measured as surely as another process's."""


def machine_busy(stat: str = "/proc/stat") -> float | None:
    """Seconds all the machine's CPUs have spent busy since boot (None: not Linux)."""
    try:
        first = Path(stat).read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if not first or first[0] != "cpu":
        return None
    ticks = [int(v) for v in first[1:]]
    return sum(ticks[i] for i in _BUSY_FIELDS if i < len(ticks)) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    """CPU seconds this process (every thread of it) has used."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class Mark:
    """Readings at the start of a measurement."""

    wall: float
    busy: float | None
    own: float

    @classmethod
    def now(cls) -> Mark:
        return cls(time.monotonic(), machine_busy(), own_cpu())


def others_cores(start: Mark, end: Mark, own_seconds: float) -> float | None:
    """How many of the machine's cores, on average, processes other than the measured ones
    kept busy between `start` and `end`, the measured ones having used `own_seconds` of
    CPU (None: not readable here)."""
    wall = end.wall - start.wall
    if start.busy is None or end.busy is None or wall <= 0:
        return None
    return max(0.0, end.busy - start.busy - own_seconds) / wall


def shared_reason(others: float | None, cores: int, when: str) -> str | None:
    """Why a measurement is not like for like: others kept more than OTHERS_LIMIT of the
    `cores` busy `when` (None: it is, or nothing was read)."""
    if others is None or others <= OTHERS_LIMIT * cores:
        return None
    return (
        f"other processes kept {others:.1f} of the {cores} cores busy {when} (more than "
        f"{OTHERS_LIMIT:.0%} of them)"
    )
