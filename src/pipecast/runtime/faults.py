"""Faults on demand, so that tests can kill or hang a rank where a real one would fail.

PIPECAST_FAULT='rank:step' ends that rank's process abruptly (exit code 9, no report, as a
killed process would) as it reaches the barrier before that step; 'rank:step:hang' blocks it
there instead, with its watchdog armed, as a rank stuck in a collective would be. Unset, this
costs one dictionary lookup per run.
"""

from __future__ import annotations

import os
import time

ENV = "PIPECAST_FAULT"


def planned(rank: int) -> tuple[int, str] | None:
    """(step, "die" or "hang") when this rank is to fail, else None."""
    parts = os.environ.get(ENV, "").split(":")
    if len(parts) >= 2 and int(parts[0]) == rank:
        return int(parts[1]), parts[2] if len(parts) > 2 else "die"
    return None


def strike(fault: tuple[int, str] | None, step: int) -> None:
    """Fail here when `fault` names this step."""
    if fault is None or fault[0] != step:
        return
    if fault[1] == "hang":
        time.sleep(10**6)
    os._exit(9)
