"""The bench measures like for like: every CPU rank of a suite with one share of the cores,
each world warmed up before its first row, rows whose machine was shared set apart, and
each row's step-to-step spread against the gaps it is there to show."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from pipecast.orchestration.bench import threads
from pipecast.orchestration.bench.accuracy import comparisons, summary, unlike
from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.predictions import predictions, unpredicted
from pipecast.orchestration.bench.runner import run_suite
from pipecast.orchestration.bench.sharing import Mark, shared_reason, waited, waited_share
from pipecast.orchestration.bench.spread import step_spread, unsettled
from pipecast.orchestration.bench.store import Row, Store
from pipecast.orchestration.bench.suites import LENET, quick
from pipecast.runtime.launch import Context

CPU = BenchConfig(
    suite="t", system="single", workload=LENET, gpus=1, batch=32, device="cpu", dtype="fp32"
)


def test_every_cpu_rank_takes_the_widest_worlds_share_of_the_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 8)
    wide = replace(CPU, system="ddp", gpus=4)
    assert threads.rank_threads([CPU, wide]) == 2  # the one-rank row too, not 8
    assert threads.rank_threads([CPU]) == 8
    assert threads.rank_threads([replace(wide, gpus=16)]) == 1
    assert threads.rank_threads([replace(CPU, device="cuda")]) is None


def test_torch_threads_holds_a_count_inside_and_restores_it() -> None:
    before = torch.get_num_threads()
    with threads.torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def _note_steps(ctx: Context, cfg: BenchConfig) -> dict[str, Any]:
    """A system that records, from rank 0, which runs it was asked for, in order, and with
    how many threads its rank computed."""
    if ctx.rank == 0:
        with open(cfg.tags["log"], "a") as fh:
            fh.write(json.dumps([cfg.gpus, cfg.steps, cfg.warmup, torch.get_num_threads()]) + "\n")
    return {"step_time": 0.01, "step_times": [0.01] * cfg.steps}


def test_a_world_warms_up_on_its_first_row_and_every_rank_has_one_share(
    tmp_path: Path,
) -> None:
    """The first row of a world is not the first thing the world runs: one unrecorded
    warm-up of it comes first; the rows then run as configured. A one-rank row computes
    with the threads of a rank of the suite's widest world, as the two-rank rows do (the
    launcher alone would give it every core)."""
    log = tmp_path / "calls.jsonl"
    first = replace(CPU, system="noted", steps=5, warmup=2, tags={"log": str(log)})
    second = replace(first, batch=16)
    wide = replace(first, gpus=2)
    store = run_suite(
        [first, second, wide], str(tmp_path / "s.sqlite"), systems={"noted": _note_steps}
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    share = threads.rank_threads([first, wide])
    assert calls == [
        [1, 1, 1, share],  # the one-rank world's warm-up
        [1, 5, 2, share],
        [1, 5, 2, share],
        [2, 1, 1, share],  # the two-rank world's
        [2, 5, 2, share],
    ]
    assert [r.status for r in store.rows()] == ["ok"] * 3
    row = store.row(first.key)
    assert row is not None and row.measured is not None
    assert row.measured["threads"] == [share]
    assert row.environment["threads"] == share and "GPU" not in row.environment["card"]


def test_waited_reads_the_threads_run_queue_delay(tmp_path: Path) -> None:
    """The second field of the thread's schedstat, in ns; unreadable: not known."""
    stat = tmp_path / "schedstat"
    stat.write_text("500 2500000000 7\n")
    assert waited(str(stat)) == pytest.approx(2.5)
    stat.write_text("junk\n")
    assert waited(str(stat)) is None
    assert waited(str(tmp_path / "absent")) is None
    assert waited() is not None  # this kernel keeps it (Linux)


def test_a_wait_over_a_tenth_of_the_time_is_not_like_for_like() -> None:
    start, end = Mark(10.0, 1.0), Mark(12.0, 1.5)
    assert waited_share(start, end) == pytest.approx(0.25)  # 0.5 s of 2 s
    assert waited_share(Mark(10.0, None), end) is None
    assert shared_reason(0.25, "its slowest rank") == (
        "its slowest rank waited for a core 25% of the time (more than 10%): other "
        "processes were using the machine"
    )
    assert shared_reason(0.1, "its profile") is None
    assert shared_reason(None, "its profile") is None


def _row(cfg: BenchConfig, measured: dict[str, Any], predicted: dict[str, Any] | None) -> Row:
    return Row(cfg.key, "t", "ok", cfg.to_dict(), {"card": "CPU x"}, measured, predicted, None)


def test_a_cpu_row_on_a_shared_machine_is_not_compared() -> None:
    """A CPU row whose ranks, or whose profile, waited for a core is left out of the
    accuracy, with why; a quiet one and a GPU row are kept."""
    quiet = {"step_time": 0.01, "waited": [0.02, 0.05]}
    busy = quiet | {"waited": [0.02, 0.4]}
    pred = {"step_time": 0.011, "basis": {"waited": 0.01}}
    profiled_busy = pred | {"basis": {"waited": 0.3}}
    rows = [
        _row(CPU, quiet, pred),
        _row(replace(CPU, batch=16), busy, pred),
        _row(replace(CPU, batch=8), quiet, profiled_busy),
        _row(replace(CPU, batch=4, device="cuda"), busy, pred),
    ]
    assert unlike(rows[0]) is None and unlike(rows[3]) is None
    assert "its slowest rank waited for a core 40% of the time" in str(unlike(rows[1]))
    assert "its profile waited for a core 30% of the time" in str(unlike(rows[2]))
    assert [c.label for c in comparisons(rows)] == [
        BenchConfig.from_dict(rows[i].config).label() for i in (0, 3)
    ]


def test_the_summary_has_no_memory_figures_where_none_was_measured() -> None:
    rows = [_row(CPU, {"step_time": 0.01, "peak_allocated": [0]}, {"step_time": 0.012})]
    s = summary(comparisons(rows))
    assert s["memory_configurations"] == 0 and "median_abs_memory_error" not in s
    assert s["median_abs_error"] == pytest.approx(0.2)
    assert all(v == v for v in s.values())  # no NaN anywhere


def test_step_spread_is_the_interquartile_range_over_the_median() -> None:
    assert step_spread([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx((4.0 - 2.0) / 3.0)
    assert step_spread([1.0, 2.0, 3.0]) is None  # too few for quartiles


def test_a_row_whose_spread_hides_its_gap_to_the_nearest_row_is_marked() -> None:
    """1.00 vs 1.05 s (5% apart) measured with 20% spreads: neither order is settled; a
    row 50% away from both is."""
    wide = [0.8, 0.9, 1.0, 1.1, 1.2]  # quartiles 0.9 and 1.1: 20% of the median
    rows = [
        _row(CPU, {"step_time": 1.0, "step_times": wide}, None),
        _row(
            replace(CPU, batch=32, system="ddp", gpus=2),
            {"step_time": 1.05, "step_times": [t * 1.05 for t in wide]},
            None,
        ),
        _row(
            replace(CPU, system="pipecast", gpus=2, boundaries=(0, 6, 12)),
            {"step_time": 1.6, "step_times": [1.6] * 5},
            None,
        ),
        _row(
            replace(CPU, batch=64), {"step_time": 1.02, "step_times": wide}, None
        ),  # another batch
    ]
    marks = unsettled(rows)
    assert set(marks) == {rows[0].key, rows[1].key}
    assert marks[rows[0].key].gap == pytest.approx(0.05)
    assert marks[rows[0].key].nearest == BenchConfig.from_dict(rows[1].config).label()


def test_labels_say_what_runs_on_any_device() -> None:
    assert CPU.label() == "lenet5/mnist b32 one device"
    assert replace(CPU, microbatches=4).label() == "lenet5/mnist b32 one device acc4"
    assert replace(CPU, system="ddp", gpus=2).label() == "lenet5/mnist b32 data parallel x2"
    assert all("GPU" not in c.label() and "DDP" not in c.label() for c in quick())


def test_rows_pipecast_does_not_predict_say_why() -> None:
    torch_row = next(c for c in quick() if c.system == "torch")
    trained = next(c for c in quick() if c.accuracy_steps)
    assert "own schedules" in str(unpredicted(torch_row))
    assert "accuracy" in str(unpredicted(trained))
    assert unpredicted(CPU) is None


def test_each_prediction_names_what_it_came_from() -> None:
    from tests.values.profile.helpers import shipped_profile

    from pipecast.values.hardware.presets import preset
    from pipecast.values.models.workload import Workload

    profile = shipped_profile()
    workload = Workload.from_dict(profile.workload)
    cfg = BenchConfig(suite="t", system="single", workload=workload, gpus=1, batch=32)
    basis = {"device": "H100", "profile": "p", "cluster": "c"}
    got = predictions([cfg], {workload.key: profile}, preset("h100-nvlink"), lambda key: basis)
    assert got[cfg.key]["basis"] == basis and got[cfg.key]["step_time"] > 0


def test_the_report_shows_a_shared_row_without_its_prediction(tmp_path: Path) -> None:
    from pipecast.report.html import build

    store = Store(tmp_path / "s.sqlite")
    measured = {"step_time": 0.01, "waited": [0.6], "samples_per_second": 3200}
    store.put(CPU.key, "t", "ok", CPU.to_dict(), {"card": "CPU x"}, measured, {"step_time": 0.0123})
    _, md = build(store, tmp_path / "report.html")
    text = Path(md).read_text()
    assert "12.30" not in text  # the prediction is not shown
    assert "not predicted like for like: its slowest rank waited for a core 60%" in text
    assert "No measured row was predicted like for like." in text


def test_the_summary_sets_the_reserve_beside_the_predicted_peak() -> None:
    """Two GPU rows, predicted 100 and 200 bytes at the peak: the first's ranks reserved 90
    and 105 (the most, 105, is +5% over), the second's 240 (+20%): a median of +12.5%, at
    most +20%, one row over the 10% margin; and the report says so in a sentence."""
    from pipecast.report.accuracy_section import _accuracy_lines

    gpu = replace(CPU, device="cuda", gpus=2, system="ddp")
    rows = [
        _row(
            gpu,
            {"step_time": 1.0, "peak_allocated": [80, 95], "peak_reserved": [90, 105]},
            {"step_time": 1.0, "peak_memory": [100, 100]},
        ),
        _row(
            replace(gpu, batch=64),
            {"step_time": 1.0, "peak_allocated": [190, 180], "peak_reserved": [240, 200]},
            {"step_time": 1.0, "peak_memory": [200, 200]},
        ),
    ]
    s = summary(comparisons(rows))
    assert s["reserved_configurations"] == 2 and s["reserved_over_10_percent"] == 1
    assert s["median_reserved_over"] == pytest.approx(0.125)
    assert s["worst_reserved_over"] == pytest.approx(0.2)
    text = " ".join(_accuracy_lines(s))
    assert "against the predicted peak (2 rows): a median +12.5%, at most +20.0%" in text
    assert "1 more than 10% over" in text


def test_a_cpu_row_whose_host_sped_up_or_slowed_past_the_bound_is_not_compared() -> None:
    """Profiled with the reference loop at 10 ms: a CPU row whose ranks read 6 and 7 ms
    (median 6.5: the host 1.54x as fast) and one reading 14 ms (1.4x as slow) are left out,
    with how far the host moved; one reading 9 and 11 ms (median 10) is compared, and so is
    a GPU row however its host moved (its step follows its device)."""
    pred = {"step_time": 0.011, "host_reference": 0.010}
    rows = [
        _row(CPU, {"step_time": 0.01, "host_reference": [0.006, 0.007]}, pred),
        _row(replace(CPU, batch=16), {"step_time": 0.01, "host_reference": [0.014]}, pred),
        _row(replace(CPU, batch=8), {"step_time": 0.01, "host_reference": [0.009, 0.011]}, pred),
        _row(
            replace(CPU, batch=4, device="cuda"),
            {"step_time": 0.01, "host_reference": [0.005]},
            pred,
        ),
    ]
    assert unlike(rows[0]) == (
        "the host ran 1.54x as fast as while its profile was taken "
        "(the reference loop: 6.5 ms against 10.0 ms)"
    )
    assert unlike(rows[1]) is not None and "1.40x as slow" in str(unlike(rows[1]))
    assert unlike(rows[2]) is None and unlike(rows[3]) is None
    assert len(comparisons(rows)) == 2
