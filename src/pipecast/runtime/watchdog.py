"""No silent hangs: a thread that notices when a rank stops making progress.

The engine tells the watchdog which action it is on. If an action (or the end of a step)
takes longer than the timeout, the watchdog reports where this rank is stuck (the action, what
it waits for, and its `Position`) to the launcher that started it, or prints it with the plan's
grid where none collects it (under torchrun), tries to tear the process group down, and ends
the process with EXIT_LOST. Every rank runs one, so when a peer dies each survivor reports
within the timeout; the launcher prints one grid with every rank's position marked.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

import torch.distributed as dist

from pipecast.runtime.outcome import Position, write_report
from pipecast.values.plan.action import Action, Plan
from pipecast.values.plan.grid import render_grid

EXIT_LOST = 3
"""The exit code of a run that lost a rank (it died, or made no progress within the timeout),
apart from 2, bad input: rerunning the same command may well succeed."""


_last: Watchdog | None = None
"""The watchdog this process started last: where its rank was when something failed."""


def position() -> Position | None:
    """Where this process's rank is, as its last watchdog saw it: None where it ran none, or
    that one's job had ended (it stands idle between steps and after the last)."""
    return _last.position() if _last is not None and _last.armed else None


class Watchdog:
    def __init__(
        self, plan: Plan | None, pipeline_rank: int, global_rank: int, timeout_s: float
    ) -> None:
        self.plan, self.pipeline_rank, self.global_rank = plan, pipeline_rank, global_rank
        self.timeout_s = timeout_s
        self._action: Action | None = None
        self._what = "starting"
        self._since = time.monotonic()
        self._armed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="pipecast-watchdog")

    def __enter__(self) -> Watchdog:
        global _last
        _last = self
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def at(self, action: Action | None, what: str) -> None:
        """Record progress: now on `action`, doing `what`."""
        self._action, self._what = action, what
        self._since = time.monotonic()
        self._armed = True

    def idle(self) -> None:
        """Between steps: the user's own code may take as long as it likes."""
        self._armed = False

    @property
    def armed(self) -> bool:
        return self._armed

    def position(self) -> Position:
        return Position(self.global_rank, self.pipeline_rank, self._action, self._what)

    def report(self, grid: bool = True) -> str:
        """What this rank is stuck on; with `grid`, the plan's grid with its action marked."""
        waited = time.monotonic() - self._since
        where = f" at {self._action}" if self._action else ""
        marks = {self.pipeline_rank: self._action} if self._action else {}
        shown = grid and self.plan is not None
        rows = f"\n{render_grid(self.plan, marks=marks)}" if shown and self.plan else ""
        return (
            f"rank {self.global_rank} (pipeline rank {self.pipeline_rank}) made no "
            f"progress for {waited:.0f} s{where}: {self._what}{rows}"
        )

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout_s / 4)):
            if self._armed and time.monotonic() - self._since > self.timeout_s:
                # a launcher prints every rank's position in one grid; alone, say it here
                if not write_report("error", self.report(grid=False), where=self.position()):
                    print(f"pipecast: {self.report()}", file=sys.stderr, flush=True)
                closer = threading.Thread(target=_destroy, daemon=True)
                closer.start()
                closer.join(5.0)
                os._exit(EXIT_LOST)


def _destroy() -> None:
    with contextlib.suppress(Exception):
        if dist.is_initialized():
            dist.destroy_process_group()
