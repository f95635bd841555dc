"""train --recommendation runs what recommend picked with its sequences split: the
strategy's context-parallel degree reaches the job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.cli.stand_ins import WorkStarted, stand_in_work

from pipecast.cli.main import main
from pipecast.runtime.job import TrainJob


def test_train_runs_a_recommendation_of_context_parallelism(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replicas, each sequence over 2 GPUs: 4 ranks, one stage, CP 2."""
    strategy = {"kind": "data", "replicas": 2, "microbatches": 1, "cp": 2}
    entry = {"strategy": strategy, "partition": [0, 4], "label": "data parallel x2 x CP x2",
             "step_time": 0.01, "peak_memory": 0}  # fmt: skip
    workload = {"model": "gpt", "dataset": "tokens", "seq_len": 8, "vocab": 64, "width": 32,
                "layers": 2, "heads": 4}  # fmt: skip
    doc = {"ranked": [entry], "batch": 8, "device": "cpu", "dtype": "fp32",
           "optimizer": "adam", "workload": workload}  # fmt: skip
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
    assert (job.cp, job.replicas, job.plan.num_ranks) == (2, 2, 1)
