"""The public surface: `import pipecast` and the loop's functions by their short names."""

from __future__ import annotations

import pytest
from torch import nn

import pipecast
from pipecast.errors import ConfigError
from pipecast.planning.recommend.rank import recommend as rank
from pipecast.values.hardware.presets import PRESETS
from pipecast.values.models.workload import Workload
from pipecast.values.profile.reference import reference_profile


def test_the_package_exports_the_loop() -> None:
    from pipecast.planning.schedules.generators import make_plan
    from pipecast.planning.simulation.simulator import simulate
    from pipecast.values.plan.action import Plan

    assert pipecast.make_plan is make_plan and pipecast.simulate is simulate
    assert pipecast.Plan is Plan
    plan = pipecast.make_plan("zb-h1", 2, 4)
    assert isinstance(plan, pipecast.Plan) and plan.split_backward
    assert set(pipecast.__all__) >= {"train", "infer", "recommend", "Profile", "Plan"}
    with pytest.raises(AttributeError):
        _ = pipecast.no_such_name  # type: ignore[attr-defined]


def test_recommend_for_a_named_gpu_node_ranks_from_the_shipped_profile() -> None:
    """Planning for GPUs this machine lacks predicts from pipecast's own profile of them:
    the same ranking as the recommender fed that profile and the preset directly (on 4 of
    the node's 8 GPUs: the same rule, with far fewer strategies to predict)."""
    out = pipecast.recommend(
        "resnet50", dataset="imagenet", batch=256, gpus=4, cluster="h100-nvlink"
    )
    assert out.profile_source == "shipped" and out.elsewhere
    cluster = PRESETS["h100-nvlink"]
    profile = reference_profile(
        Workload(model="resnet50", dataset="imagenet"), "bf16", cluster.device
    )
    assert profile is not None
    want = rank(profile, cluster, 256, gpus=4, epoch_samples=1_281_167)
    got = out.recommendation
    assert [p.strategy for p in got.ranked] == [p.strategy for p in want.ranked]
    assert got.best.step_time == pytest.approx(want.best.step_time)
    assert out.to_dict()["run"]["label"] == want.best.strategy.label()


def test_recommend_takes_a_module_and_profiles_it_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module is profiled here; one it cannot validate (that needs it by name) is refused
    before the profiling, not after it."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))
    out = pipecast.recommend(model, dataset="mnist", batch=16, gpus=2, device="cpu")
    assert out.profile_source == "given" and out.workload is None and not out.elsewhere
    assert out.profile.num_blocks == 4
    assert out.recommendation.ranked and out.to_dict()["workload"] is None

    def profiled(*args: object, **kwargs: object) -> None:
        raise AssertionError("profiled a model it then refused")

    monkeypatch.setattr("pipecast.api.profile_model", profiled)
    with pytest.raises(ConfigError, match="need it by name"):
        pipecast.recommend(model, dataset="mnist", batch=16, gpus=2, device="cpu", validate=1)


def test_a_job_the_api_refuses_says_what_to_give_instead(tmp_path: object) -> None:
    """Issue 55: these named what was wrong, not what to pass instead."""
    from pipecast.api import make_job
    from pipecast.runtime.checkpoint import Checkpointing
    from pipecast.runtime.job import TrainJob
    from pipecast.values.partition import from_boundaries

    lenet = Workload(model="lenet5", dataset="mnist")
    with pytest.raises(ConfigError, match=r"the job 2 x 8: make the plan for 2 x 8, or give the"):
        make_job(lenet, partition="0,6,12", plan=pipecast.make_plan("1f1b", 3, 4))
    with pytest.raises(ConfigError, match=r"at least 4\): give a batch of 4 or more, or fewe"):
        make_job(lenet, partition="0,6,12", batch=3, microbatches=4)
    job, _ = make_job(lenet, partition="0,6,12", microbatches=4)
    other = TrainJob(**{**job.__dict__, "partition": from_boundaries([0, 5, 10])})
    with pytest.raises(ConfigError, match="the model has 12: give boundaries that end at 12"):
        other.check()
    with pytest.raises(ConfigError, match="nothing to checkpoint: leave the checkpoint out"):
        make_job(
            lenet,
            partition="0,6,12",
            schedule="forward-only",
            checkpoint=Checkpointing(str(tmp_path)),
        )
