"""What a rank leaves for the launcher that started it: its result, or why it failed and
where it was, in a file the launcher names (REPORT_ENV), so that a rank that dies never
loses what the others finished."""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipecast.values.plan.action import Action

REPORT_ENV = "PIPECAST_RANK_REPORT"


@dataclass(frozen=True)
class Position:
    """Where a rank was when it last reported progress (to its watchdog)."""

    global_rank: int
    pipeline_rank: int
    action: Action | None
    """The plan's action it was on (None: between actions, at a barrier, say)."""
    what: str


def write_report(
    status: str, value: Any, path: str | None = None, where: Position | None = None
) -> bool:
    """Leave this rank's result (and, if it failed, where it was) where the launcher collects
    it, atomically; False where no launcher collects it (under torchrun)."""
    target = path or os.environ.get(REPORT_ENV)
    if not target:
        return False
    out = Path(target)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps((status, value, where)))
    tmp.rename(out)
    return True
