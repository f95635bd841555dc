from __future__ import annotations

import pytest

from pipecast.planning.recommend.host_drift import SLOWER, SLOWER_MISS, host_drift


def test_a_slower_host_is_noted_only_for_host_bound_strategies() -> None:
    slow = host_drift(0.007, 0.013)
    assert slow is not None
    assert slow.ratio == pytest.approx(13 / 7)
    note = slow.note(host_bound=True)
    assert note is not None and "1.86x slower" in note and "13.0 ms against 7.0 ms" in note
    assert "--recalibrate" in note and f"a median {SLOWER_MISS:.0%} slower than predicted" in note
    # a device-bound recommendation does not follow the host
    assert slow.note(host_bound=False) is None
    assert slow.to_dict() == {
        "profiled": 0.007,
        "now": 0.013,
        "ratio": pytest.approx(13 / 7),
        "elsewhere": False,
    }


def test_the_note_names_another_machine_and_a_given_profile() -> None:
    here = host_drift(0.007, 0.013, profiled_on="gpu-a:1", here="gpu-a:1")
    assert here is not None and not here.elsewhere
    assert "than when the model was profiled" in (here.note(host_bound=True) or "")
    moved = host_drift(0.007, 0.013, profiled_on="gpu-a:1", here="gpu-b:2", cached=False)
    assert moved is not None and moved.elsewhere
    note = moved.note(host_bound=True) or ""
    assert "than the host the model was profiled on" in note
    # a profile the user gave is not the cache --recalibrate would measure again
    assert "--recalibrate" not in note and "pipecast profile here" in note
    # either machine unrecorded: taken as this one
    assert not (host_drift(0.007, 0.013, profiled_on="", here="gpu-b:2") or here).elsewhere


def test_a_steady_or_faster_host_is_not_noted() -> None:
    just_under = host_drift(0.010, 0.010 * SLOWER * 0.99)
    assert just_under is not None and just_under.note(host_bound=True) is None
    at = host_drift(0.010, 0.010 * SLOWER)
    assert at is not None and at.note(host_bound=True) is not None
    faster = host_drift(0.013, 0.007)
    assert faster is not None and faster.note(host_bound=True) is None


def test_no_drift_without_both_readings() -> None:
    assert host_drift(0.0, 0.010) is None  # profiled before the profiler read the host
    assert host_drift(0.010, 0.0) is None
