"""The report's HTML as a browser shows it: it loads without errors, every image renders,
and the accuracy section's figures are the store's (headless Chromium; skipped where none is
installed, .ci/run installs it)."""

from __future__ import annotations

import json
import sqlite3
import statistics
from pathlib import Path

import pytest
from tests.report.browser import chromium, load

from pipecast.cli.main import main
from pipecast.orchestration.bench.store import Store, environment
from pipecast.orchestration.bench.suites import quick

pytestmark = pytest.mark.skipif(chromium() is None, reason="no Chromium installed")

PAGE_SCRIPT = """(() => ({
  images: [...document.images].map(i => ({src: i.getAttribute('src'), width: i.naturalWidth})),
  accuracy: document.getElementById('prediction-accuracy')?.innerText ?? '',
  left_out: document.getElementById('rows-left-out-of-the-accuracy')?.innerText ?? '',
  text: document.body.innerText,
}))()"""

BASIS = {
    "device": "",
    "profile": "lenet5/mnist fp32 on cpu, 1 thread(s), taken in this launch",
    "cluster": "probed in this launch: 2 CPU ranks, 1 thread(s) each",
}


def cpu_store(path: Path) -> None:
    """Three predicted rows of the quick suite on CPU ranks (errors +10%, -25%, +10%), one
    row pipecast does not predict, with per-step times."""
    env = environment("cpu", threads=1)
    store = Store(path)
    configs = [c for c in quick() if not c.accuracy_steps]
    single, ddp, torch_row = (
        next(c for c in configs if c.system == s) for s in ("single", "ddp", "torch")
    )
    gpipe = next(c for c in configs if c.schedule == "gpipe" and c.microbatches == 4)
    steps = [0.008, 0.009, 0.010, 0.011, 0.012]
    for cfg, measured, predicted in (
        (single, 0.010, 0.011),
        (ddp, 0.020, 0.015),
        (gpipe, 0.040, 0.044),
        (torch_row, 0.030, None),
    ):
        m = {
            "step_time": measured,
            "samples_per_second": cfg.batch / measured,
            "step_times": [measured * t / 0.010 for t in steps],
            "peak_allocated": [0] * cfg.gpus,
        }
        p = None
        if predicted is not None:
            p = {
                "step_time": predicted,
                "peak_memory": [0],
                "basis": BASIS | {"device": env["card"]},
            }
        store.put(cfg.key, "quick", "ok", cfg.to_dict(), env, m, p)


def store_errors(path: Path) -> list[float]:
    """|predicted / measured - 1| of every row with both, read from the file itself."""
    with sqlite3.connect(path) as db:
        rows = db.execute("select measured, predicted from results where status = 'ok'")
        pairs = [(json.loads(m), json.loads(p)) for m, p in rows if m and p]
    return [abs(p["step_time"] / m["step_time"] - 1) for m, p in pairs if "step_time" in p]


def test_the_page_loads_renders_every_image_and_shows_the_stores_accuracy(tmp_path: Path) -> None:
    store = tmp_path / "b.sqlite"
    cpu_store(store)
    page = tmp_path / "out" / "report.html"
    assert main(["report", "--store", str(store), "-o", str(page)]) == 0
    loaded = load(page, PAGE_SCRIPT)
    assert loaded.errors == []
    images = loaded.value["images"]
    assert len(images) >= 2  # speed-ups and predicted against measured at least
    assert all(i["width"] > 0 for i in images), images
    errors = store_errors(store)
    assert len(errors) == 3
    accuracy = loaded.value["accuracy"]
    assert f"median |error| {statistics.median(errors):.1%}" in accuracy  # 10.0%
    assert f"worst {max(errors):.1%}" in accuracy  # 25.0%
    assert "Covers 3 measured rows on CPU" in accuracy
    assert "torch's own schedules" in loaded.value["left_out"]  # the row left out, and why
    text = loaded.value["text"]
    assert "nan" not in text.lower().split() and "nan%" not in text.lower()
    assert "GPU" not in text


def test_a_page_whose_image_is_missing_fails_the_check(tmp_path: Path) -> None:
    """The check itself: an image the page links but the folder lacks reads as not
    rendered, and its failed load is reported."""
    store = tmp_path / "b.sqlite"
    cpu_store(store)
    page = tmp_path / "report.html"
    assert main(["report", "--store", str(store), "-o", str(page)]) == 0
    (tmp_path / "report_files" / "speedups.png").unlink()
    loaded = load(page, PAGE_SCRIPT)
    assert any(i["width"] == 0 for i in loaded.value["images"])
    assert loaded.errors
