"""What `pipecast train --recommendation` reads from a recommendation file."""

from __future__ import annotations

import pytest

from pipecast.errors import ConfigError
from pipecast.planning.recommend.chosen import chosen


def _entry(kind: str, label: str, partition: list[int], **strategy: object) -> dict[str, object]:
    return {
        "strategy": {"kind": kind, **strategy},
        "label": label,
        "partition": partition,
        "step_time": 0.25,
    }


DOC = {
    "batch": 64,
    "workload": {"model": "resnet18", "dataset": "cifar10"},
    "device": "cuda",
    "dtype": "bf16",
    "optimizer": "adam",
    "ranked": [
        _entry("data", "data parallel x4", [0, 11], replicas=4, schedule="gpipe"),
        _entry(
            "hybrid",
            "2 x zb-h1 2 stages",
            [0, 5, 11],
            stages=2,
            replicas=2,
            schedule="zb-h1",
            microbatches=4,
        ),
    ],
}


def test_the_choice_is_the_run_entry_else_the_first_ranked() -> None:
    first = chosen(DOC)
    assert first.label == "data parallel x4" and first.strategy.gpus == 4
    assert first.schedule == "1f1b"  # one stage: micro-batches accumulate, whatever it says
    assert first.partition == "0,11" and first.batch == 64 and first.predicted == 0.25
    assert first.workload is not None and first.workload.dataset == "cifar10"
    assert (first.device, first.dtype, first.optimizer, first.autocast) == (
        "cuda",
        "bf16",
        "adam",
        False,
    )
    run = {**DOC, "run": DOC["ranked"][1]}  # type: ignore[index]
    assert chosen(run).schedule == "zb-h1" and chosen(run).partition == "0,5,11"
    assert chosen(run, pick=1).label == "data parallel x4"


def test_a_file_that_cannot_be_run_is_a_one_line_error() -> None:
    with pytest.raises(ConfigError, match="pick 1 to 2"):
        chosen(DOC, pick=3)
    with pytest.raises(ConfigError, match=r"nothing fits to run \(recommend again with more GPUs"):
        chosen({"batch": 8, "ranked": []})
    with pytest.raises(ConfigError, match=r"no strategy and partition \(pass what `pipecast rec"):
        chosen({"batch": 8, "ranked": [{"label": "x"}]})
    old = chosen({k: v for k, v in DOC.items() if k != "workload"})
    assert old.workload is None  # the caller asks for --model


def test_a_recorded_plan_is_the_one_that_runs() -> None:
    """A schedule searched on costs (zb-auto) cannot be rebuilt from its name: the file's
    plan text comes back as the same Plan; a file without one leaves the name to rebuild."""
    from pipecast.planning.recommend.auto_schedule import auto_plan
    from pipecast.planning.simulation import Costs

    plan = auto_plan(2, 4, Costs.uniform(2))
    entry = {**_entry("pipeline", "zb-auto 2 stages", [0, 5, 11], stages=2, schedule="zb-auto",
                      microbatches=4), "plan": plan.to_text()}  # fmt: skip
    assert chosen({**DOC, "ranked": [entry]}).plan == plan
    assert chosen(DOC).plan is None
