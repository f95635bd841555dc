from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from torch import nn

import pipecast.api
from pipecast.cli.main import main
from pipecast.errors import ConfigError
from pipecast.runtime import checkpoint
from pipecast.values.models import Workload


@pytest.mark.slow
def test_train_verb_runs_and_writes_both_traces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no results store here: the report is of the run alone
    code = main(
        [
            "train",
            "--model",
            "lenet5",
            "--dataset",
            "digits",
            "--gpus",
            "2",
            "--schedule",
            "1f1b",
            "--micro-batches",
            "4",
            "--batch",
            "32",
            "--steps",
            "2",
            "--warmup-steps",
            "1",
            "--out-dir",
            str(tmp_path),
            "--kernel-trace",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    # the step before the last, traced on rank 0 (a spawned rank: the tracer travelled)
    kernels = json.loads((tmp_path / "lenet5-1f1b-2.kernels.json").read_text())
    assert kernels["kernels"] == 0 and kernels["host_threads"][0]["busy_ms"] > 0
    assert (tmp_path / "lenet5-1f1b-2.kernels.trace.json.gz").stat().st_size > 0
    # the quick profile balances the stages; its step time is drawn, not quoted
    assert "samples/s" in out and "predicted step" not in out
    trace = json.loads((tmp_path / "lenet5-1f1b-2.measured.trace.json").read_text())
    labels = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert any(lbl.startswith("predicted") for lbl in labels)
    assert any(lbl.startswith("measured") for lbl in labels)
    measured = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] >= 100]
    assert {e["name"] for e in measured} >= {"0F0", "1BW3"}
    # the run's numbers beside its trace, for scripts (benchmarks/beyond_memory.py reads them)
    summary = json.loads((tmp_path / "lenet5-1f1b-2.summary.json").read_text())
    assert summary["samples_per_second"] == pytest.approx(32 / summary["step_time"])
    assert len(summary["peak_allocated"]) == 2 and "predicted_step_time" not in summary
    # what a user who just trained runs next (issue 55: it once wanted a bench store)
    path = "lenet5-1f1b-2.measured.trace.json"
    assert main(["report", "--trace", path, "-o", "report.html"]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "## Run: lenet5-1f1b-2.measured" in md and "| measured | 2 |" in md


@pytest.mark.slow
def test_infer_verb(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "infer",
            "--model",
            "lenet5",
            "--gpus",
            "2",
            "--micro-batches",
            "2",
            "--batch",
            "16",
            "--steps",
            "1",
            "--warmup-steps",
            "0",
            "--partition",
            "0,6,12",
            "--out-dir",
            str(tmp_path),
        ]
    )
    assert code == 0
    assert "batch latency" in capsys.readouterr().out


def test_train_bad_input_fails_before_starting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--model", "lenet5", "--gpus", "2", "--partition", "0,3,5,12"]) == 2
    assert "3 stages do not share out evenly over 2 pipeline ranks" in capsys.readouterr().err
    assert (
        main(
            [
                "train",
                "--model",
                "lenet5",
                "--gpus",
                "2",
                "--batch",
                "6",
                "--micro-batches",
                "8",
                "--partition",
                "0,6,12",
            ]
        )
        == 2
    )
    assert "cannot feed" in capsys.readouterr().err
    # torch's optimizer would refuse it inside every worker, with a traceback each
    with pytest.raises(SystemExit, match="2"):  # argparse's range check
        main(["train", "--model", "lenet5", "--gpus", "2", "--lr", "-1"])
    err = capsys.readouterr().err
    assert "--lr takes a number of at least 0, got '-1'" in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_python_api_refuses_uneven_replicas_and_unknown_devices() -> None:
    """Checked before anything is profiled or started: 3 GPUs in 2 replicas would quietly
    drop one, 0 replicas divide by zero, and 'gpu' would quietly run on the CPU."""
    w = Workload(model="lenet5", dataset="mnist")
    for kw in ({"gpus": 3, "replicas": 2}, {"replicas": 0}):
        with pytest.raises(ConfigError, match=r"do not split into .* of equal pipelines"):
            pipecast.api.make_job(w, partition="0,6,12", **kw)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="device must be 'cpu' or 'cuda', got 'gpu'"):
        pipecast.api.make_job(w, partition="0,6,12", device="gpu")
    job, _ = pipecast.api.make_job(w, gpus=4, replicas=2, partition="0,6,12")
    assert job.world == 4 and job.replicas == 2


@pytest.mark.slow
def test_python_api_trains_a_users_sequential() -> None:
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Linear(32, 10))
    result = pipecast.api.train(
        model,
        dataset="mnist",
        gpus=2,
        schedule="gpipe",
        microbatches=2,
        batch=16,
        steps=2,
        warmup_steps=0,
    )
    assert result.summary["samples_per_second"] > 0
    assert result.job.partition.num_blocks == 4


def _train_args(out: Path, steps: int, *extra: str) -> list[str]:
    return [
        "train",
        "--model",
        "lenet5",
        "--dataset",
        "digits",  # real data: a resumed run must skip the batches already drawn
        "--gpus",
        "2",
        "--micro-batches",
        "4",
        "--batch",
        "32",
        "--partition",
        "0,6,12",
        "--optimizer",
        "momentum",
        "--warmup-steps",
        "1",
        "--steps",
        str(steps),
        "--out-dir",
        str(out),
        *extra,
    ]


@pytest.mark.slow
def test_train_resumes_from_its_checkpoint_to_the_uninterrupted_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert main(_train_args(tmp_path, 4, "--checkpoint-dir", str(whole))) == 0
    assert main(_train_args(tmp_path, 2, "--checkpoint-dir", str(parts))) == 0
    done = f"checkpoint: {parts / 'step-00000003'} (after 1 warm-up step and steps 1 to 2, "
    assert done + "written in " in capsys.readouterr().out
    assert main(_train_args(tmp_path, 4, "--checkpoint-dir", str(parts))) == 2
    assert "already holds a checkpoint (step 3)" in capsys.readouterr().err
    assert main(_train_args(tmp_path, 4, "--checkpoint-dir", str(parts), "--resume")) == 0
    out = capsys.readouterr().out
    assert "(3 steps done)" in out
    assert f"{parts / 'step-00000005'} (after 1 warm-up step and steps 1 to 4, written in " in out
    want, got = checkpoint.model_state(whole), checkpoint.model_state(parts)
    assert set(want) == set(got)
    for name, tensor in want.items():
        assert torch.allclose(got[name], tensor, rtol=1e-6, atol=1e-7), name
    assert main(["train", "--model", "lenet5", "--resume"]) == 2
    assert "need --checkpoint-dir" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime") is None, reason="onnxruntime is not installed"
)
def test_infer_compares_with_onnxruntime(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pipeline's and ONNX Runtime's outputs of the last batch each lie within 1e-5 of
    one process's on the same weights; a latency run moves one request."""
    args = ["infer", "--model", "lenet5", "--gpus", "2", "--partition", "0,6,12", "--steps",
            "2", "--warmup-steps", "1", "--out-dir", str(tmp_path)]  # fmt: skip
    assert main([*args, "--batch", "12", "--micro-batches", "3", "--compare", "onnxruntime"]) == 0
    out = capsys.readouterr().out
    rows = {
        name: (float(line.split("│")[-3]), float(line.split("│")[-2]))
        for line in out.splitlines()
        for name in ("pipecast", "PyTorch", "ONNX Runtime")
        if line.count("│") == 7 and name in line.split("│")[1]
    }
    assert set(rows) == {"pipecast", "PyTorch", "ONNX Runtime"}
    assert rows["PyTorch"] == (0.0, 0.0)
    assert max(rows["pipecast"]) <= 1e-5 and max(rows["ONNX Runtime"]) <= 1e-5
    assert main([*args, "--mode", "latency"]) == 0
    assert "batch 1 in 1 micro-batch" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed"
)
def test_infer_compares_with_deepspeed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["infer", "--model", "lenet5", "--gpus", "2", "--partition", "0,6,12", "--steps",
            "1", "--warmup-steps", "0", "--batch", "8", "--micro-batches", "2", "--out-dir",
            str(tmp_path), "--compare", "deepspeed"]  # fmt: skip
    assert main(args) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if "DeepSpeed" in line]
    assert float(row.split("│")[-2]) <= 1e-5


def test_compare_with_a_runtime_not_installed_stops_before_running(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name)
    )
    assert main(["infer", "--model", "lenet5", "--compare", "deepspeed"]) == 2
    err = capsys.readouterr().err
    assert "--compare deepspeed: deepspeed is not installed" in err


def test_the_comparison_feeds_one_process_what_the_ranks_drew() -> None:
    """A bf16 run's ranks draw the last step's batch from its seed and round it to bf16;
    one process and the other runtimes get those very values, not the fp32 draw (on GPUs
    the draw itself is the device generator's, which differs from the CPU's)."""
    import torch

    from pipecast.api import make_job
    from pipecast.cli.infer_compare import last_batch
    from pipecast.runtime.config import RunConfig
    from pipecast.runtime.run import JobResult
    from pipecast.values.data.synthetic import synthetic_batch
    from pipecast.values.models import Workload

    lenet = Workload(model="lenet5", dataset="mnist")
    job, _ = make_job(
        lenet, schedule="forward-only", partition="0,6,12", batch=8, microbatches=2, steps=2,
        warmup_steps=1, config=RunConfig(dtype="bf16"),
    )  # fmt: skip
    drawn, _ = synthetic_batch(lenet.spec, 8, seed=job.config.seed + job.total_steps - 1)
    got = last_batch(JobResult(job, []))
    assert torch.equal(got, drawn.to(torch.bfloat16).float())
    assert not torch.equal(got, drawn)
