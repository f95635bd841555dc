"""No silent hangs: a thread that notices when a rank stops making progress.

The engine tells the watchdog which action it is on. If an action (or the end of a step)
takes longer than the timeout, the watchdog prints this rank's report (the action it is stuck
on, what it waits for, and the plan's grid with that action marked), tries to tear the
process group down, and ends the process with exit code 3. Every rank runs one, so when a peer
dies each survivor reports within the timeout.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

import torch.distributed as dist

from pipecast.values.plan.action import Action, Plan
from pipecast.values.plan.grid import render_grid

EXIT_TIMEOUT = 3


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

    def report(self) -> str:
        waited = time.monotonic() - self._since
        where = f" at {self._action}" if self._action else ""
        marks = {self.pipeline_rank: self._action} if self._action else {}
        grid = f"\n{render_grid(self.plan, marks=marks)}" if self.plan is not None else ""
        return (
            f"pipecast: rank {self.global_rank} (pipeline rank {self.pipeline_rank}) made no "
            f"progress for {waited:.0f} s{where}: {self._what}{grid}"
        )

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout_s / 4)):
            if self._armed and time.monotonic() - self._since > self.timeout_s:
                text = self.report()
                print(text, file=sys.stderr, flush=True)
                from pipecast.runtime.launch import write_report

                write_report("error", text.removeprefix("pipecast: "))
                closer = threading.Thread(target=_destroy, daemon=True)
                closer.start()
                closer.join(5.0)
                os._exit(EXIT_TIMEOUT)


def _destroy() -> None:
    with contextlib.suppress(Exception):
        if dist.is_initialized():
            dist.destroy_process_group()
