"""Stand-ins for the work a CLI verb starts (profiling, recommending, a suite, a run, a probe):
each raises WorkStarted, a BaseException the CLI does not catch, so a test sees whether an
input was refused before any work began."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

WORK = (
    "pipecast.api.quick_profile",
    "pipecast.cli.train_verb.run_job",
    "pipecast.cli.profile_verb.profile_model",
    "pipecast.cli.recommend_verb.recommend_for",
    "pipecast.cli.bench_verb.basis_for",
    "pipecast.cli.bench_verb.run_suite",
    "pipecast.cli.probe_verb.probe",
)
"""What every verb's work starts with."""


class WorkStarted(BaseException):
    """Raised by the stand-ins for a verb's work, which the CLI does not catch."""


def stand_in_work(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, targets: Iterable[str] = WORK
) -> None:
    """Replace `targets` with stand-ins that raise WorkStarted, plan as on a machine without
    GPUs (the same on GPU hosts), and work in `tmp_path` (default outputs, pipecast-out/...,
    land there if anywhere)."""

    def started(*args: object, **kwargs: object) -> None:
        raise WorkStarted

    for target in targets:
        monkeypatch.setattr(target, started)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
