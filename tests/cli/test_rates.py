"""What train and infer print of a run's FLOP rate: TFLOP/s per GPU and MFU."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from torch import nn

from pipecast.cli import rates
from pipecast.cli.main import main
from pipecast.cli.rates import measured_rate, tflops
from pipecast.runtime.job import TrainJob
from pipecast.runtime.run import JobResult
from pipecast.runtime.worker import RankReport, StepRecord
from pipecast.values.data import get_spec
from pipecast.values.models import Workload

LENET_FORWARD = 2 * (28 * 28 * 6 * 25 + 10 * 10 * 16 * 6 * 25 + 400 * 120 + 120 * 84 + 84 * 10)
"""LeNet-5 on one MNIST image by hand: conv1 (28 x 28 outputs x 6 channels x 5 x 5 x 1),
conv2 (10 x 10 x 16 x 5 x 5 x 6) and the three Linears, 2 FLOPs per multiply-add."""


def test_train_prints_its_tflops_per_rank_in_the_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stand-in run of 10 ms steps on 2 CPU ranks, batch 32: 3 forwards a sample over the
    step and the ranks; CPU ranks get no MFU."""

    def run_job(job: TrainJob, **kwargs: object) -> JobResult:
        steps = [StepRecord(s, 0.01, 2.0, 0, 0) for s in range(job.warmup_steps, job.total_steps)]
        return JobResult(job, [RankReport(r, r, 0, [r], steps=steps) for r in range(job.world)])

    monkeypatch.setattr("pipecast.cli.train_verb.run_job", run_job)
    argv = ["train", "--model", "lenet5", "--partition", "0,6,12", "--gpus", "2"]
    argv += ["--device", "cpu", "--batch", "32", "--steps", "3", "--out-dir", str(tmp_path)]
    assert main(argv) == 0
    summary = next(line for line in capsys.readouterr().out.splitlines() if "median step" in line)
    expected = tflops(3 * LENET_FORWARD * 32 / 0.01 / 2)
    assert f"3,200.0 samples/s, {expected} TFLOP/s per rank" in summary
    assert "MFU" not in summary


def _job(**fields: Any) -> Any:
    defaults = {"workload": None, "model": None, "batch": 8, "world": 2, "device": "cuda"}
    return SimpleNamespace(**{**defaults, **fields})


def test_on_an_h100_the_rate_is_a_share_of_the_presets_measured_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GPT of 2 layers (Megatron-LM's 24 s h^2 + 4 s^2 h a layer, 2 s h V the head) at
    batch 8 on 2 H100s in 50 ms a step; inference is one forward."""
    monkeypatch.setattr(rates.devices, "resolve", lambda device: device)
    monkeypatch.setattr(rates.devices, "name", lambda device: "NVIDIA H100 80GB HBM3")
    s, h, v = 128, 64, 100
    gpt = Workload(model="gpt", dataset="tokens", seq_len=s, vocab=v, width=h, layers=2, heads=4)
    forward = 2 * (24 * s * h * h + 4 * s * s * h) + 2 * s * h * v
    per_gpu = 3 * forward * 8 / 0.05 / 2
    assert measured_rate(_job(workload=gpt), 0.05, inference=False) == (
        f", {tflops(per_gpu)} TFLOP/s per GPU, MFU {per_gpu / 789e12:.0%} (of 789 TFLOP/s, "
        "h100-nvlink's measured bf16 rate)"
    )
    assert measured_rate(_job(workload=gpt), 0.05, inference=True).startswith(
        f", {tflops(per_gpu / 3)} TFLOP/s per GPU"
    )


def test_a_users_model_is_counted_and_an_unknown_gpu_gets_no_mfu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rates.devices, "resolve", lambda device: device)
    monkeypatch.setattr(rates.devices, "name", lambda device: "Some Accelerator")
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 100))
    job = _job(model=model, spec=get_spec("mnist"), batch=10, world=1)
    assert measured_rate(job, 1e-6, inference=False) == (
        f", {tflops(3 * 2 * 784 * 100 * 10 / 1e-6)} TFLOP/s per GPU"
    )
    assert measured_rate(_job(), 0.05, inference=False) == ""  # nothing to count


def test_tflops_keep_the_digits_that_mean_something() -> None:
    assert [tflops(r) for r in (412.4e12, 41.24e12, 0.05123e12)] == ["412", "41.2", "0.0512"]
