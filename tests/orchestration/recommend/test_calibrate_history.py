from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.values.profile.helpers import scaled, shipped_profile

from pipecast.orchestration.recommend import calibrate
from pipecast.orchestration.recommend.calibrate import (
    HISTORY,
    calibrated_profile,
    pooled_with_history,
)
from pipecast.values.models.workload import Workload
from pipecast.values.profile.types import Profile


def _forward(p: Profile) -> float:
    """One block's host forward at the first size: enough to tell which readings pooled."""
    return p.blocks[3].costs[p.micro_batch_sizes[0]].host_forward


def test_a_first_profile_is_kept_as_measured(tmp_path: Path) -> None:
    base = shipped_profile()
    out = pooled_with_history(tmp_path / "profile-x.json", base)
    assert out.host.pooled == 1 and _forward(out) == _forward(base)
    assert len(list((tmp_path / "profile-x.history").glob("*.json"))) == 1


def test_later_profiles_pool_with_the_newest_readings_only(tmp_path: Path) -> None:
    base, path = shipped_profile(), tmp_path / "profile-x.json"
    factors = [float(i) for i in range(1, HISTORY + 3)]  # two more than the history keeps
    for f in factors:
        out = pooled_with_history(path, scaled(base, f))
        out.save(str(path))
    kept = factors[-HISTORY:]
    assert out.host.pooled == HISTORY
    assert len(list(path.with_suffix(".history").glob("*.json"))) == HISTORY  # pruned
    assert _forward(out) == pytest.approx(_forward(base) * sum(kept) / len(kept))


def test_a_profile_cached_before_histories_joins_the_history(tmp_path: Path) -> None:
    base, path = shipped_profile(), tmp_path / "profile-x.json"
    scaled(base, 1.0).save(str(path))  # the cache as a pipecast without histories left it
    out = pooled_with_history(path, scaled(base, 3.0))
    assert out.host.pooled == 2
    assert _forward(out) == pytest.approx(_forward(base) * 2.0)


def test_files_that_do_not_load_or_match_are_passed_over(tmp_path: Path) -> None:
    base, path = shipped_profile(), tmp_path / "profile-x.json"
    history = path.with_suffix(".history")
    history.mkdir()
    (history / "5.json").write_text("{ not a profile")
    (history / "notes.json").write_text("{}")
    shipped_profile("resnet50").save(str(history / "7.json"))  # another model
    scaled(base, 5.0).save(str(history / "9.json"))
    out = pooled_with_history(path, scaled(base, 1.0))
    assert out.host.pooled == 2
    assert _forward(out) == pytest.approx(_forward(base) * 3.0)


def test_recalibrating_pools_and_the_cache_returns_the_pooled_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIPECAST_CACHE", str(tmp_path))
    base = shipped_profile()
    readings = iter([scaled(base, 1.0), scaled(base, 3.0)])

    def fake_profile_model(*_: Any, **__: Any) -> Profile:
        return next(readings)

    monkeypatch.setattr(calibrate, "profile_model", fake_profile_model)
    lenet = Workload(model="lenet5", dataset="mnist")
    args: dict[str, Any] = {"device": "cpu", "dtype": "fp32", "autocast": False, "pool": True}
    first, cached = calibrated_profile(lenet, (1, 2), **args)
    assert not cached and first.host.pooled == 1
    second, cached = calibrated_profile(lenet, (1, 2), refresh=True, **args)
    assert not cached and second.host.pooled == 2
    assert _forward(second) == pytest.approx(_forward(base) * 2.0)
    again, cached = calibrated_profile(lenet, (1, 2), **args)
    assert cached and _forward(again) == pytest.approx(_forward(second))
    # without pooling (the default on CPU), a recalibration replaces the reading
    readings = iter([scaled(base, 5.0)])
    alone, _ = calibrated_profile(
        lenet, (1, 2), refresh=True, device="cpu", dtype="fp32", autocast=False
    )
    assert alone.host.pooled == 1 and _forward(alone) == pytest.approx(_forward(base) * 5.0)
