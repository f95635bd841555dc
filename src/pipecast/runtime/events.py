"""Timing each action of a step: CUDA events on GPU (no synchronisation until the step
ends), perf_counter on CPU. Times are relative to the step's start on this rank."""

from __future__ import annotations

import time

import torch

from pipecast.values.timeline import Event


class ActionClock:
    def __init__(self, device: torch.device, enabled: bool) -> None:
        self.cuda = device.type == "cuda"
        self.enabled = enabled
        self._marks: list[tuple[int, str, str, int, int, object, object]] = []
        self._origin: object = None

    def start_step(self) -> None:
        self._marks = []  # a new list: the last step's marks may still be resolved later
        self._origin = self._now()

    def _now(self) -> object:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
            return event
        return time.perf_counter()

    def begin(self) -> object:
        return self._now() if self.enabled else None

    def end(self, begin: object, rank: int, name: str, kind: str, stage: int, mb: int) -> None:
        if self.enabled:
            self._marks.append((rank, name, kind, stage, mb, begin, self._now()))

    def take(self) -> StepMarks:
        """The step's marks, to resolve into events when (and if) someone reads them."""
        return StepMarks(self._origin, self._marks)


class StepMarks:
    """One step's timed actions, unresolved: resolving waits for the device to reach each
    mark (CUDA events), so a step whose events nobody reads never pays for it."""

    def __init__(
        self, origin: object, marks: list[tuple[int, str, str, int, int, object, object]]
    ) -> None:
        self._origin, self._marks = origin, marks

    def resolve(self) -> list[Event]:
        out = []
        for rank, name, kind, stage, mb, a, b in self._marks:
            out.append(Event(rank, name, kind, self._since(a), self._since(b), stage, mb))
        return out

    def _since(self, mark: object) -> float:
        if isinstance(mark, torch.cuda.Event):
            assert isinstance(self._origin, torch.cuda.Event)
            mark.synchronize()
            return float(self._origin.elapsed_time(mark)) / 1e3
        assert isinstance(mark, float) and isinstance(self._origin, float)
        return mark - self._origin
