"""--virtual-stages: simulate prices interleaving over any count of virtual stages per rank,
and a count or micro-batching the schedule cannot run is refused with one line, exit 2,
before any work (issue 67)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.cli.stand_ins import WorkStarted, stand_in_work
from tests.cli.test_bad_input import PROFILE, check_refused

from pipecast.cli.main import main
from pipecast.planning.schedules import make_plan
from pipecast.runtime.job import TrainJob
from pipecast.values.models import Workload
from pipecast.values.strategy import Strategy

LENET = ["--model", "lenet5", "--gpus", "2", "--device", "cpu"]
INTERLEAVED = ["train", *LENET, "--schedule", "interleaved"]


def test_simulate_prices_four_virtual_stages_a_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", *PROFILE, "--stages", "2", "--schedule", "interleaved"]
    argv += ["--virtual-stages", "4", "--micro-batches", "4", "--out-dir", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "interleaved 2 stages x4 virtual, M=4" in out
    trace = json.loads((tmp_path / "resnet50-interleaved-v4-2x4.trace.json").read_text())
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {f"{s}F3" for s in range(8)} <= names and "8F0" not in names


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["simulate", *PROFILE, "--stages", "2", "--virtual-stages", "3"],
            "1f1b runs 1 stage(s) per rank, not 3 virtual stages: only the interleaved "
            "schedule takes a count of virtual stages",
        ),
        (
            ["train", *LENET, "--schedule", "zb-v", "--virtual-stages", "3"],
            "zb-v runs 2 stage(s) per rank, not 3 virtual stages",
        ),
        (
            [*INTERLEAVED, "--virtual-stages", "4", "--micro-batches", "3", "--batch", "12"],
            "interleaved 1F1B needs micro-batches divisible by ranks (3 % 2 = 1): use 4",
        ),
        (
            [*INTERLEAVED, "--virtual-stages", "8"],
            "interleaved on 2 pipeline rank(s) runs 16 stages, but the model has 12 blocks: "
            "use fewer ranks or virtual stages (at most 12 stages)",
        ),
        (
            [*INTERLEAVED, "--partition", "0,1,3,4,6,7,9,10,12"],
            "boundaries [0, 1, 3, 4, 6, 7, 9, 10, 12] give 8 stages; interleaved on 2 pipeline "
            "rank(s) needs 4: give 4 virtual stages per rank (--virtual-stages 4)",
        ),
        (
            [*INTERLEAVED, "--virtual-stages", "1"],
            "--virtual-stages takes a count of at least 2, got 1",
        ),
    ],
)
def test_a_count_the_schedule_cannot_run_is_refused_before_work(
    argv: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stand_in_work(monkeypatch, tmp_path)
    check_refused([*argv, "--out-dir", str(tmp_path / "out")], message, tmp_path, capsys)


def test_train_follows_a_recommendation_of_four_virtual_stages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file's strategy names its virtual stages, and train runs its 8-stage partition
    over 2 ranks with the plan made for them (the file records no plan here)."""
    entry = {
        "strategy": Strategy(
            kind="pipeline", stages=2, schedule="interleaved", virtual=4, microbatches=4
        ).to_dict(),
        "partition": [0, 1, 3, 4, 6, 7, 9, 10, 12],
        "step_time": 0.01,
    }
    doc = {"batch": 8, "device": "cpu", "ranked": [entry],
           "workload": Workload(model="lenet5", dataset="mnist").to_dict()}  # fmt: skip
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(doc))
    stand_in_work(monkeypatch, tmp_path)
    jobs: list[TrainJob] = []

    def started(job: TrainJob, **kwargs: object) -> None:
        jobs.append(job)
        raise WorkStarted

    monkeypatch.setattr("pipecast.cli.train_verb.run_job", started)
    with pytest.raises(WorkStarted):
        main(["train", "--recommendation", str(path), "--out-dir", str(tmp_path / "out")])
    (job,) = jobs
    assert job.plan == make_plan("interleaved", 2, 4, virtual=4)
    assert job.partition.boundaries == entry["partition"]


def test_partition_exports_the_plan_of_its_virtual_stages(tmp_path: Path) -> None:
    """8 stages as interleaved over 4 virtual stages a rank: torch's schedule CSV has the 2
    ranks' rows, each running the stages of its loop."""
    argv = ["partition", *PROFILE, "--stages", "8", "--schedule", "interleaved"]
    argv += ["--virtual-stages", "4", "--micro-batches", "4", "--export", "torch"]
    assert main([*argv, "--out-dir", str(tmp_path)]) == 0
    rows = (tmp_path / "resnet50-interleaved-8.schedule.csv").read_text().split()
    assert len(rows) == 2
    for rank, row in enumerate(rows):
        assert {int(a.split("F")[0]) for a in row.split(",") if "F" in a} == {
            rank + 2 * k for k in range(4)
        }
