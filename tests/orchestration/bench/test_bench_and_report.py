from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from tests.report.browser import chromium, load
from tests.report.test_report_in_browser import PAGE_SCRIPT

from pipecast.cli.main import main
from pipecast.orchestration.bench import suites
from pipecast.orchestration.bench.accuracy import Comparison, decisions, summary
from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.runner import run_suite
from pipecast.orchestration.bench.store import Store
from pipecast.orchestration.bench.suites import LENET, quick
from pipecast.orchestration.bench.threads import rank_threads

WARMUP, STEPS = 1, 3
"""The quick suite's warm-up and timed steps in these tests: what they assert of its rows
(every configuration, its step count, its prediction and accuracy) holds at any count, and
its own 5 and 40 steps are for figures read off the timings, which no test reads."""


@pytest.fixture(scope="module")
def quick_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bench") / "bench.sqlite"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(suites, "QUICK_WARMUP", WARMUP)
        patch.setattr(suites, "QUICK_STEPS", STEPS)
        assert main(["bench", "--suite", "quick", "--store", str(path)]) == 0
    return path


@pytest.mark.slow
def test_quick_suite_writes_every_configuration(quick_store: Path) -> None:
    rows = list(Store(quick_store).rows(suite="quick"))
    assert len(rows) == len(quick())
    assert all(r.status == "ok" for r in rows), [r.error for r in rows if r.status != "ok"]
    systems = {r.config["system"] for r in rows}
    assert systems == {"pipecast", "torch", "ddp", "single"}
    assert all(r.environment["torch"] for r in rows)
    # every rank's host speed around its measurement, one reading per GPU the row used
    assert all(
        len(r.measured["host_reference"]) == r.config["gpus"]
        and all(v > 0 for v in r.measured["host_reference"])
        and len(r.measured["host_issue"]) == r.config["gpus"]
        and all(v > 0 for v in r.measured["host_issue"])
        and len(r.measured["host_issue_before"]) == r.config["gpus"]
        and all(v > 0 for v in r.measured["host_issue_before"])
        for r in rows
    )
    predicted = [r for r in rows if r.predicted]
    assert len(predicted) >= 8  # every pipecast, DDP and single-device row has a prediction
    # one device is the same share of the cores in every row, and the profile's
    threads = {t for r in rows for t in r.measured["threads"]}
    assert threads == {rank_threads(quick())}
    assert all(str(r.environment["card"]).startswith("CPU ") for r in rows)
    timed = [r for r in rows if not r.config["accuracy_steps"]]
    assert all(len(r.measured["step_times"]) == STEPS for r in timed)
    assert {r.config["warmup"] for r in timed} == {WARMUP}
    assert {p.predicted["basis"]["cluster"] for p in predicted} == {
        f"probed in this launch: 2 CPU ranks, {rank_threads(quick())} thread(s) each"
    }
    errors = {
        r.config["tags"]["accuracy"]: r.measured["top1_error"]
        for r in rows
        if r.config["tags"].get("accuracy")
    }
    assert set(errors) == {"single device", "data parallel", "pipeline"}
    assert all(e < 0.1 for e in errors.values())  # digits trains to > 90% every way
    assert abs(errors["pipeline"] - errors["single device"]) <= 0.01


@pytest.mark.slow
def test_report_renders_with_every_image(quick_store: Path, tmp_path: Path) -> None:
    page_path = tmp_path / "report.html"
    assert main(["report", "--store", str(quick_store), "-o", str(page_path)]) == 0
    page = page_path.read_text()
    images = re.findall(r"<img src='([^']+)'", page)
    assert len(images) >= 2  # speed-ups, micro-batch study (accuracy: where rows compare)
    for image in images:
        assert (tmp_path / image).read_bytes()[:4] == b"\x89PNG"
    md = (tmp_path / "report.md").read_text()
    assert "| suite | configuration |" in md and "Prediction accuracy" in md
    for text in (page, md):  # CPU ranks: no GPU named, no number missing
        assert "GPU" not in text and not re.search(r"\bnan\b", text, re.IGNORECASE)
    if chromium() is not None:  # as a browser shows it
        loaded = load(page_path, PAGE_SCRIPT)
        assert loaded.errors == []
        assert all(i["width"] > 0 for i in loaded.value["images"]), loaded.value["images"]


def _good_and_bad(suite: str) -> tuple[BenchConfig, BenchConfig]:
    """A configuration that runs and one that fails (its split overruns the model)."""
    good = replace(quick()[0], suite=suite, steps=3, warmup=1)  # resuming is the point here
    return good, replace(good, system="pipecast", gpus=2, boundaries=(0, 6, 99))


@pytest.mark.slow
def test_suite_resumes_and_records_failures(tmp_path: Path) -> None:
    store_path = str(tmp_path / "s.sqlite")
    good, bad = _good_and_bad("t")
    run_suite([good, bad], store_path)
    rows = {r.key: r for r in Store(store_path).rows()}
    assert rows[good.key].status == "ok"
    assert rows[bad.key].status == "failed" and rows[bad.key].error
    first = rows[good.key].measured
    run_suite([good, bad], store_path)  # nothing left to do: rows stay as they were
    assert {r.key: r.measured for r in Store(store_path).rows()}[good.key] == first


@pytest.mark.slow
def test_rounds_measure_every_configuration_again_and_keep_the_median(tmp_path: Path) -> None:
    store_path = str(tmp_path / "r.sqlite")
    good, bad = _good_and_bad("r")
    run_suite([good, bad], store_path, rounds=2)
    rows = {r.key: r for r in Store(store_path).rows()}
    m = rows[good.key].measured
    assert m is not None and len(m["rounds"]) == 2
    assert m["step_time"] == pytest.approx(sum(m["rounds"]) / 2)  # the median of two
    assert m["samples_per_second"] == pytest.approx(good.batch / m["step_time"])
    assert len(m["host_reference_rounds"]) == 2 and len(m["host_reference"]) == good.gpus
    assert len(m["host_issue_before_rounds"]) == 2
    assert rows[bad.key].status == "failed"  # a failed configuration gets no more rounds
    # resumed with one more round: only the missing round runs, on top of the two
    run_suite([good, bad], store_path, rounds=3)
    again = Store(store_path).row(good.key)
    assert again is not None and again.measured is not None
    assert again.measured["rounds"][:2] == m["rounds"] and len(again.measured["rounds"]) == 3
    assert again.measured["step_time"] == sorted(again.measured["rounds"])[1]


def test_accuracy_harness_arithmetic() -> None:
    comps = [
        Comparison("a", "g", 1.0, 1.1, 10.0, 10.0),
        Comparison("b", "g", 2.0, 1.0, None, None),
        Comparison("c", "h", 1.0, 1.0, 9.0, 10.0, host_share=0.95),
    ]
    d = {x.group: x for x in decisions(comps)}
    assert d["g"].picked == "a" and d["g"].fastest == "b"
    assert d["g"].slowdown == pytest.approx(0.1)
    s = summary(comps)
    assert s["worst_abs_error"] == pytest.approx(1.0)
    assert s["median_abs_memory_error"] == pytest.approx(0.05)
    assert s["within_7_percent"] == 1 and s["within_20_percent"] == 2
    # c is host-bound and exact; a and b are device-bound with errors 1/11 and 1
    assert s["host_bound_configurations"] == 1 and s["host_bound_worst_abs_error"] == 0.0
    assert s["device_bound_configurations"] == 2
    assert s["device_bound_median_abs_error"] == pytest.approx((1 / 11 + 1.0) / 2)
    assert "host_drift_median" not in s  # no host-speed readings, no rescaled errors
    # a host-bound step predicted 1.0, measured 1.3 while the host ran 1.3x slower than when
    # profiled: 23% off as predicted, exact at the host speed it ran at
    slow = Comparison("d", "k", 1.0, 1.3, None, None, host_share=0.9, host_drift=1.3)
    s = summary([slow])
    assert s["host_bound_median_abs_error"] == pytest.approx(0.3 / 1.3)
    assert s["host_bound_median_abs_error_at_run_host_speed"] == pytest.approx(0.0)
    assert s["host_drift_median"] == pytest.approx(1.3)


def test_accuracy_apart_where_the_rounds_agreed() -> None:
    """A miss on a configuration whose rounds moved 40% is not counted with the misses on
    configurations measured repeatably; the rounds' spread is reported."""
    steady = Comparison("a", "g", 1.0, 1.05, None, None, round_spread=0.04)
    moving = Comparison("b", "g", 1.0, 1.6, None, None, round_spread=0.4)
    once = Comparison("c", "h", 1.0, 1.0, None, None)
    assert steady.repeatable and not moving.repeatable and not once.repeatable
    s = summary([steady, moving, once])
    assert s["round_spread_median"] == pytest.approx(0.22)
    assert s["round_spread_worst"] == pytest.approx(0.4)
    assert s["repeatable_configurations"] == 1
    assert s["repeatable_worst_abs_error"] == pytest.approx(0.05 / 1.05)
    assert s["worst_abs_error"] == pytest.approx(0.6 / 1.6)
    assert "round_spread_median" not in summary([once])


def test_the_accuracy_plot_spans_each_configurations_rounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A configuration measured in rounds gets a line at its prediction from its fastest
    round to its slowest; one measured once gets none."""
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure

    from pipecast.report import plots

    drawn: list[Figure] = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig) or path)
    rounds = Comparison("a", "g", 0.05, 0.04, None, None, rounds=(0.03, 0.04, 0.06))
    once = Comparison("b", "g", 0.01, 0.01, None, None, host_share=0.9)
    assert plots.accuracy([rounds, once], str(tmp_path / "a.png"))
    lines = [c for c in drawn[0].axes[0].collections if isinstance(c, LineCollection)]
    segments = [seg.tolist() for line in lines for seg in line.get_segments()]
    assert segments == [[[30.0, 50.0], [60.0, 50.0]]]


def test_report_without_store_is_a_clean_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", "--store", str(tmp_path / "none.sqlite")]) == 2
    assert "run `pipecast bench` first" in capsys.readouterr().err


def test_report_tells_a_slow_host_from_a_miss(tmp_path: Path) -> None:
    """Two host-bound rows measured 1.3x their predictions while the host read 1.3x slower
    than when profiled: the report says so, and that at that speed they were exact."""
    from pipecast.orchestration.bench.config import BenchConfig
    from pipecast.report.html import build

    store = Store(str(tmp_path / "s.sqlite"))
    for m in (4, 8):
        cfg = BenchConfig(
            suite="s", system="single", workload=LENET, gpus=1, batch=32, microbatches=m
        )
        store.put(
            cfg.key,
            "s",
            "ok",
            cfg.to_dict(),
            {"torch": "x"},
            {"step_time": 1.3 * m, "peak_allocated": [1], "host_reference": [0.013]},
            {"step_time": 1.0 * m, "peak_memory": [1], "host_share": 0.95, "host_reference": 0.01},
        )
    _, md = build(str(tmp_path / "s.sqlite"), tmp_path / "r" / "report.html")
    text = Path(md).read_text()
    assert "a median 1.30x as slow as when profiled" in text
    assert "their median |error| would be 0.0%" in text


def test_a_comparison_keeps_the_rounds_its_row_measured(tmp_path: Path) -> None:
    from pipecast.orchestration.bench.accuracy import comparisons

    store = Store(str(tmp_path / "s.sqlite"))
    cfg = BenchConfig(suite="s", system="single", workload=LENET, gpus=1, batch=32)
    measured = {"step_time": 2.0, "rounds": [1.0, 2.0, 3.0], "peak_allocated": [1]}
    store.put(cfg.key, "s", "ok", cfg.to_dict(), {}, measured, {"step_time": 2.0})
    (c,) = comparisons(store.rows())
    assert c.rounds == (1.0, 2.0, 3.0)
    assert c.round_spread == pytest.approx(1.0)


TWO_STAGES = BenchConfig(
    suite="t",
    system="pipecast",
    workload=LENET,
    gpus=2,
    batch=8,
    microbatches=2,
    boundaries=(0, 6, 12),
    device="cpu",
    dtype="fp32",
)


def test_an_uncut_comparison_run_keeps_stored_keys_and_goes_unpredicted() -> None:
    """Configurations stored before the switch existed keep their keys; the uncut variant
    is a distinct row, labelled, and left out of the accuracy (the profile prices cut
    stages only)."""
    from pipecast.measuring.profiler.options import ProfileOptions
    from pipecast.measuring.profiler.profiler import profile_model
    from pipecast.orchestration.bench.predictions import predictions
    from pipecast.values.hardware.presets import preset

    cut = replace(TWO_STAGES, schedule="zb-h1")
    uncut = replace(cut, cut_backward=False)
    assert "cut_backward" not in cut.to_dict()
    assert uncut.key != cut.key and BenchConfig.from_dict(uncut.to_dict()) == uncut
    assert uncut.label() == cut.label() + " uncut"
    profile = profile_model(
        LENET.build(), LENET.spec, ProfileOptions(micro_batch_sizes=(4,), device="cpu", repeats=2)
    )
    got = predictions([cut, uncut], {LENET.key: profile}, preset("h100-nvlink"))
    assert set(got) == {cut.key}


def _events_on_rank(ctx: object) -> list[list[object]]:
    from pipecast.orchestration.bench.timing import gather_events
    from pipecast.values.timeline import Event

    rank = ctx.rank  # type: ignore[attr-defined]
    return gather_events([Event(rank, f"0F{rank}", "F", 0.001 * rank, 0.002 + rank, 0, rank)])


def test_every_ranks_actions_gather_into_one_timeline() -> None:
    from pipecast.runtime.launch import spawn
    from pipecast.values.timeline import Event

    on_each = spawn(_events_on_rank, 2, timeout_s=60)
    assert on_each[0] == on_each[1]
    events = [Event.from_row(r) for r in on_each[0]]
    assert [(e.rank, e.mb) for e in events] == [(0, 0), (1, 1)]
    assert events[1].start == pytest.approx(0.001) and events[1].end == pytest.approx(1.002)


def test_the_report_sets_the_worst_miss_beside_its_prediction(tmp_path: Path) -> None:
    """A row that recorded its actions is drawn, simulated above measured; one without is
    not."""
    from pipecast.report.html import build

    store = Store(str(tmp_path / "s.sqlite"))
    cfg = TWO_STAGES
    sim = [[r, f"0F{m}", "F", 100.0 * m, 100.0 * m + 90, r, m] for r in (0, 1) for m in (0, 1)]
    real = [[r, f"0F{m}", "F", 150.0 * m, 150.0 * m + 140, r, m] for r in (0, 1) for m in (0, 1)]
    store.put(
        cfg.key,
        "t",
        "ok",
        cfg.to_dict(),
        {},
        {"step_time": 3e-4, "timeline": real},
        {"step_time": 2e-4, "timeline": sim},
    )
    other = replace(cfg, microbatches=1)
    store.put(other.key, "t", "ok", other.to_dict(), {}, {"step_time": 3e-4}, {"step_time": 1e-4})
    build(str(tmp_path / "s.sqlite"), tmp_path / "report.html")
    assert (tmp_path / "report_files" / "miss_0.png").exists()
    assert not (tmp_path / "report_files" / "miss_1.png").exists()
    page = (tmp_path / "report.md").read_text()
    assert "worst-predicted configurations that recorded their actions" in page
    # action by action: F on each rank, simulated 0.090 ms, measured 0.140 ms
    assert "action by action" in page
    assert page.count("| 0.090 | 0.140 | 1.56x |") == 2


def test_actions_are_compared_rank_by_rank_and_kind_by_kind() -> None:
    """Matched by name on each rank: means of the simulated and measured actions of each
    kind, transfers and the optimizer left out, an action only one timeline has left out,
    and the rank's host seconds per action from the measured row's counters."""
    from pipecast.report.actions import action_gaps
    from pipecast.values.timeline import Event

    sim = [
        Event(0, "0F0", "F", 0.0, 1e-3),
        Event(0, "0F1", "F", 1e-3, 2e-3),
        Event(0, "send 0F0", "send", 1e-3, 1.1e-3),
        Event(1, "1BW0", "BW", 2e-3, 5e-3),
        Event(1, "1BW1", "BW", 5e-3, 8e-3),  # never measured
        Event(1, "optimizer", "optimizer", 8e-3, 9e-3),
    ]
    real = [
        Event(0, "0F0", "F", 0.0, 2e-3),
        Event(0, "0F1", "F", 2e-3, 6e-3),
        Event(1, "1BW0", "BW", 3e-3, 4.5e-3),
        Event(1, "optimizer", "optimizer", 5e-3, 9e-3),
    ]
    actions = {"host_F": [6e-3, 0.0], "count_F": [2.0, 0.0], "host_BW": [0.0, 4e-3]}
    gaps = action_gaps(sim, real, actions)
    assert [(g.rank, g.kind, g.count) for g in gaps] == [(0, "F", 2), (1, "BW", 1)]
    f, bw = gaps
    assert f.predicted == pytest.approx(1e-3) and f.measured == pytest.approx(3e-3)
    assert f.ratio == pytest.approx(3.0) and f.host == pytest.approx(3e-3)
    assert bw.predicted == pytest.approx(3e-3) and bw.measured == pytest.approx(1.5e-3)
    assert bw.host is None  # no count recorded for it
