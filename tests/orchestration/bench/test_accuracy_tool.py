"""benchmarks/accuracy.py: the ranges `recommend` quotes, computed from rows by hand."""

from __future__ import annotations

import pytest
from benchmarks.accuracy import bands, summary_lines

from pipecast.orchestration.bench.accuracy import Comparison
from pipecast.values.timeline import HOST_BOUND


def _row(error: float, *, host: bool, gpus: int, drift: float | None = None) -> Comparison:
    return Comparison(
        label=f"{error}",
        group="g",
        predicted=1.0 + error,
        measured=1.0,
        predicted_memory=None,
        measured_memory=None,
        host_share=HOST_BOUND if host else 0.0,
        host_drift=drift,
        gpus=gpus,
    )


def test_ranges_are_the_deciles_rounded_outward_by_regime() -> None:
    # eleven device-bound rows on one GPU, -5% .. +5%: deciles -4% and +4% exactly
    one = [_row(e / 100, host=False, gpus=1) for e in range(-5, 6)]
    # host-bound over several GPUs, deciles -0.123 and +0.087 before rounding outward
    several = [_row(e, host=True, gpus=2) for e in (-0.15, -0.12, 0.0, 0.08, 0.09)]
    other = [_row(0.0, host=True, gpus=1), _row(0.01, host=True, gpus=1)]
    other += [_row(0.0, host=False, gpus=4), _row(0.02, host=False, gpus=4)]
    doc = bands([("run", c) for c in one + several + other], cpu=[-0.3, 0.0, 0.1])
    ranges = doc["error_range"]
    assert ranges["device|one GPU"]["range"] == [-0.04, 0.04]
    assert ranges["device|one GPU"]["rows"] == 11
    low, high = ranges["host|several GPUs"]["range"]
    assert (low, high) == (-0.14, 0.09)  # -0.138 and 0.086 rounded outward
    assert doc["cpu_error_range"]["rows"] == 3


def test_the_slowed_host_miss_is_the_median_of_host_bound_rows_that_slowed() -> None:
    rows = [
        _row(-0.10, host=True, gpus=2, drift=1.3),
        _row(-0.20, host=True, gpus=2, drift=1.5),
        _row(-0.40, host=True, gpus=1, drift=2.0),
        _row(-0.90, host=True, gpus=2, drift=1.1),  # not slowed enough
        _row(-0.90, host=False, gpus=2, drift=3.0),  # device-bound
    ]
    rows += [_row(e, host=h, gpus=g) for e in (0.0, 0.01) for h in (True, False) for g in (1, 2)]
    doc = bands([("r", c) for c in rows], cpu=[0.0, 0.1])
    assert doc["slower_miss"]["value"] == pytest.approx(0.20)
    assert doc["slower_miss"]["rows"] == 3
    assert doc["slower_miss"]["beyond_20_percent"] == 1


def test_summary_counts_rows_within_20_percent_and_picks() -> None:
    fast = _row(0.1, host=False, gpus=2)
    slow = Comparison("b", "g", 2.5, 2.0, None, None)  # +25%, predicted slower and is
    table = summary_lines([("run1", fast), ("run1", slow)])
    assert table[-1].startswith("| run1 | 2 | 17.5% | 25.0% | 1 |")
    assert table[-1].endswith("| 1/1 |")
