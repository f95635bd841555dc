"""--shard-optimizer as a user types it: train and simulate take it, and a combination it
cannot run with is refused in one line, exit 2, before any work starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.cli.stand_ins import WorkStarted, stand_in_work
from tests.planning.partition.test_partition import make_profile

from pipecast.cli.main import main
from pipecast.runtime.job import TrainJob

LENET = ["--model", "lenet5", "--partition", "0,12", "--device", "cpu", "--steps", "1"]
ZERO = ["train", *LENET, "--optimizer", "adam", "--shard-optimizer"]


def test_train_runs_its_replicas_with_the_optimizer_sharded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The job the CLI makes carries the choice to the ranks, and the header names it."""
    ran: list[TrainJob] = []

    def run_job(job: TrainJob, **kwargs: object) -> None:
        ran.append(job)
        raise WorkStarted

    stand_in_work(monkeypatch, tmp_path)
    monkeypatch.setattr("pipecast.cli.train_verb.run_job", run_job)
    with pytest.raises(WorkStarted):
        main([*ZERO, "--gpus", "2", "--replicas", "2"])
    [job] = ran
    assert job.config.shard_optimizer and job.replicas == 2
    assert "data parallel x2 (optimizer sharded) on 2 cpu ranks" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        (
            ["--gpus", "1"],
            "--shard-optimizer shards the optimizer's state over data-parallel replicas, and "
            "there is 1: add --replicas N (N of at least 2 dividing --gpus)",
        ),
        (
            ["--gpus", "2", "--replicas", "2", "--shard", "full"],
            "--shard-optimizer beside --shard full: FSDP shards the optimizer's state with "
            "the weights already: drop one of them",
        ),
        (
            ["--gpus", "4", "--replicas", "2", "--tensor-parallel", "2"],
            "--shard-optimizer does not run with --tensor-parallel 2: drop one of them",
        ),
        (
            ["--gpus", "2", "--replicas", "2", "--offload", "optimizer"],
            "a sharded optimizer steps on the device, and offload 'optimizer' steps it on the "
            "host: offload the activations only, or leave the optimizer whole",
        ),
    ],
)
def test_train_refuses_what_it_cannot_run_with(
    extra: list[str],
    line: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stand_in_work(monkeypatch, tmp_path)
    assert main([*ZERO, *extra]) == 2
    assert capsys.readouterr().err == f"pipecast: error: {line}\n"


@pytest.fixture
def profile(tmp_path: Path) -> str:
    path = tmp_path / "hand.json"
    make_profile([1e-3] * 4, params=[10**6] * 4).save(str(path))
    return str(path)


def test_simulate_prices_it(
    profile: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--profile", profile, "--stages", "2", "--replicas", "2"]
    argv += ["--micro-batches", "2", "--optimizer", "adam", "--out-dir", str(tmp_path)]
    assert main([*argv, "--shard-optimizer"]) == 0
    assert "2 x 1f1b 2 stages, M=2, balanced, optimizer sharded" in capsys.readouterr().out


def test_simulate_refuses_it_without_replicas(
    profile: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--profile", profile, "--stages", "2", "--shard-optimizer"]
    assert main([*argv, "--out-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "pipecast: error: a sharded optimizer splits its state over data-parallel replicas, "
        "and there is 1: use 2 or more replicas, or leave the optimizer whole\n"
    )


def test_train_runs_a_recommendation_with_the_optimizer_sharded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What recommend picked is what runs: its strategy's choice reaches the job."""
    strategy = {"kind": "data", "replicas": 2, "microbatches": 1, "shard_optimizer": True}
    entry = {"strategy": strategy, "partition": [0, 12], "label": "data parallel x2",
             "step_time": 0.01, "peak_memory": 0}  # fmt: skip
    doc = {"ranked": [entry], "batch": 8, "device": "cpu", "dtype": "fp32",
           "optimizer": "adam", "workload": {"model": "lenet5", "dataset": "mnist"}}  # fmt: skip
    (tmp_path / "rec.json").write_text(json.dumps(doc))
    ran: list[TrainJob] = []

    def run_job(job: TrainJob, **kwargs: object) -> None:
        ran.append(job)
        raise WorkStarted

    stand_in_work(monkeypatch, tmp_path)
    monkeypatch.setattr("pipecast.cli.train_verb.run_job", run_job)
    with pytest.raises(WorkStarted):
        main(["train", "--recommendation", str(tmp_path / "rec.json")])
    [job] = ran
    assert job.config.shard_optimizer and job.replicas == 2 and job.config.optimizer == "adam"
