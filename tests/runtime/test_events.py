"""The action clock: a step's marks resolve into events when read, not before, and a later
step leaves them as they were."""

from __future__ import annotations

import torch

from pipecast.runtime.events import ActionClock
from pipecast.runtime.step_result import StepResult


def test_a_steps_marks_resolve_later_and_stay_its_own() -> None:
    clock = ActionClock(torch.device("cpu"), enabled=True)
    clock.start_step()
    mark = clock.begin()
    clock.end(mark, 0, "0F0", "F", 0, 0)
    first = StepResult(loss=None, seconds=0.0, marks=clock.take())
    clock.start_step()
    for mb in (1, 2):
        clock.end(clock.begin(), 0, f"0F{mb}", "F", 0, mb)
    resolved = []
    real = first.marks.resolve  # type: ignore[union-attr]
    first.marks.resolve = lambda: resolved.append(1) or real()  # type: ignore[union-attr,method-assign,func-returns-value]
    assert [e.name for e in first.events] == ["0F0"]
    assert [e.name for e in first.events] == ["0F0"] and resolved == [1]  # resolved once
    assert 0.0 <= first.events[0].start <= first.events[0].end
    assert [e.mb for e in clock.take().resolve()] == [1, 2]
    assert StepResult(loss=None, seconds=0.0).events == []


def test_a_disabled_clock_marks_nothing() -> None:
    clock = ActionClock(torch.device("cpu"), enabled=False)
    clock.start_step()
    clock.end(clock.begin(), 0, "0F0", "F", 0, 0)
    assert clock.take().resolve() == []
