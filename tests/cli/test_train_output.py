"""What train and infer print of a run: the layout line and the per-step table.

The table's step column ran 2..1001 for --steps 1000 (the warm-up counted in), a resumed
run's first step had no row, and the layout read "in 1 micro-batches" and "1f1b (FSDP x2 (no
reshard))" for a run of one stage. The runs here are stand-ins: the job the CLI made, with
steps as a run of it reports them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipecast.cli.main import main
from pipecast.runtime.job import TrainJob
from pipecast.runtime.run import JobResult
from pipecast.runtime.worker import RankReport, StepRecord

LENET = ["--model", "lenet5", "--partition", "0,6,12", "--gpus", "2", "--device", "cpu"]


def _ran(first: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run reports the steps a worker times: from the warm-up's end, or the step after
    the one a resume starts on (`first`: steps done before)."""

    def run_job(job: TrainJob, **kwargs: object) -> JobResult:
        timed_from = max(job.warmup_steps, first + 1 if first else 0)
        steps = [StepRecord(s, 0.01, 2.0, 0, 0) for s in range(timed_from, job.total_steps)]
        return JobResult(job, [RankReport(r, r, 0, [r], steps=steps) for r in range(job.world)])

    monkeypatch.setattr("pipecast.cli.train_verb.run_job", run_job)


def _rows(out: str) -> list[list[str]]:
    return [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines()
            if line.startswith("│")]  # fmt: skip


def test_the_step_column_counts_the_timed_steps_from_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _ran(0, monkeypatch)
    argv = ["train", *LENET, "--steps", "5", "--warmup-steps", "2", "--out-dir", str(tmp_path)]
    assert main(argv) == 0
    assert [row[0] for row in _rows(capsys.readouterr().out)] == ["1", "2", "3", "4", "5"]


def test_a_resumed_runs_first_step_has_a_row_that_says_it_is_untimed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Resumed after 4 steps (2 warm-up, 2 timed) of 2 + 6: steps 3 to 6 remain, the
    first of them untimed (it pays the cold start)."""
    _ran(4, monkeypatch)
    monkeypatch.setattr(TrainJob, "resume_from", lambda job: type("Saved", (), {"step": 4,
                        "path": "ck/step-00000004"})())  # fmt: skip
    argv = ["train", *LENET, "--steps", "6", "--warmup-steps", "2", "--out-dir", str(tmp_path)]
    assert main(argv) == 0
    rows = _rows(capsys.readouterr().out)
    assert [row[0] for row in rows] == ["3", "4", "5", "6"]
    assert rows[0][1] == "untimed" and rows[1][1].endswith("ms")


@pytest.mark.parametrize(
    ("verb", "extra", "layout"),
    [
        ("infer", ["--mode", "latency"], "forward-only on 2 cpu ranks, partition [0, 6, 12], "
         "batch 1 in 1 micro-batch"),
        ("train", ["--gpus", "1", "--partition", "0,12", "--micro-batches", "1"],
         "1f1b on 1 cpu rank, partition [0, 12], batch 64 in 1 micro-batch"),
        ("train", ["--gpus", "2", "--replicas", "2", "--shard", "grad", "--partition", "0,12"],
         "FSDP x2 (no reshard) on 2 cpu ranks, partition [0, 12], batch 64 in 1 micro-batch"),
        ("train", ["--gpus", "4", "--replicas", "2"],
         "data parallel x2 x 1f1b 2 stages on 4 cpu ranks, partition [0, 6, 12]"),
    ],
)  # fmt: skip
def test_the_layout_line_names_the_mesh_once_in_plain_words(
    verb: str,
    extra: list[str],
    layout: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _ran(0, monkeypatch)
    argv = [verb, *LENET, "--steps", "1", "--warmup-steps", "0", "--out-dir", str(tmp_path)]
    assert main([*argv, *extra]) == 0
    assert layout in capsys.readouterr().out


@pytest.mark.parametrize(
    ("done", "warmup", "said"),
    [
        (7, 2, "after 2 warm-up steps and steps 1 to 5"),
        (3, 2, "after 2 warm-up steps and step 1"),
        (1, 2, "after 1 warm-up step"),
        (4, 0, "after steps 1 to 4"),
    ],
)
def test_a_checkpoint_counts_its_steps_as_the_table_does(
    done: int,
    warmup: int,
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The final checkpoint of --steps 1000 said '1002 steps' (the warm-up counted in, as
    --resume counts): it now says which of the table's steps it follows."""
    _ran(0, monkeypatch)
    saved = type("Saved", (), {"step": done, "path": f"ck/step-{done:08d}"})()
    monkeypatch.setattr("pipecast.runtime.checkpoint.latest", lambda directory: saved)
    counts = ["--steps", str(max(done - warmup, 1)), "--warmup-steps", str(warmup)]
    argv = ["train", *LENET, *counts, "--out-dir", str(tmp_path), "--checkpoint-dir",
            str(tmp_path / "ck")]  # fmt: skip
    assert main(argv) == 0
    assert f"checkpoint: ck/step-{done:08d} ({said})" in capsys.readouterr().out
