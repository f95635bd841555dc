"""`pipecast report -o PAGE`: the page is a file, the Markdown and the images go beside
it, and a bad page or store is one line and exit code 2 before any work."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from tests.report.test_report_in_browser import cpu_store

from pipecast.cli.main import main
from pipecast.report.trace import read_trace, write_trace
from pipecast.values.timeline import Event, Timeline


def test_the_page_is_the_file_named_with_the_markdown_and_images_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "b.sqlite"
    cpu_store(store)
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--store", "b.sqlite", "-o", "report.html"]) == 0
    assert (tmp_path / "report.html").is_file() and (tmp_path / "report.md").is_file()
    images = sorted(p.name for p in (tmp_path / "report_files").iterdir())
    assert "accuracy.png" in images and "speedups.png" in images
    page = (tmp_path / "report.html").read_text()
    md = (tmp_path / "report.md").read_text()
    assert "src='report_files/accuracy.png'" in page
    assert "(report_files/accuracy.png)" in md


def test_the_default_page_is_pipecast_out_report_html(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu_store(tmp_path / "pipecast-out" / "bench.sqlite")
    monkeypatch.chdir(tmp_path)
    assert main(["report"]) == 0
    assert (tmp_path / "pipecast-out" / "report.html").is_file()
    assert (tmp_path / "pipecast-out" / "report.md").is_file()


def _exit_code(argv: list[str]) -> int:
    """main's exit code, whether it returns it or argparse exits with it."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_a_page_that_cannot_be_written_is_one_line_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing_store = str(tmp_path / "none.sqlite")  # checked after -o: -o is read first
    (tmp_path / "a_file").write_text("x")
    assert (
        _exit_code(["report", "--store", missing_store, "-o", str(tmp_path / "a_file" / "r.html")])
        == 2
    )
    assert "is a file, not a directory" in _one_line_error(capsys)
    assert _exit_code(["report", "--store", missing_store, "-o", str(tmp_path)]) == 2
    assert "is a directory" in _one_line_error(capsys)
    assert _exit_code(["report", "--store", missing_store, "-o", str(tmp_path / "r.md")]) == 2
    assert "name the HTML page" in _one_line_error(capsys)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:  # root writes into a read-only folder; the kernel's /proc/1 stops even root
        unwritable = next((d for d in (locked, Path("/proc/1")) if not os.access(d, os.W_OK)), None)
        if unwritable is None:
            pytest.skip("no folder here that this user cannot write")
        assert (
            _exit_code(["report", "--store", missing_store, "-o", str(unwritable / "r.html")]) == 2
        )
        assert "cannot write" in _one_line_error(capsys)
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "no results store at"),
        (b"", "is empty, not a results store"),
        (b"time,step\n1,2\n", "is not an SQLite file"),
    ],
)
def test_a_store_that_is_missing_empty_or_foreign_is_one_line_and_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, says: str
) -> None:
    store = tmp_path / "b.sqlite"
    if content is not None:
        store.write_bytes(content)
    page = tmp_path / "out" / "report.html"
    assert main(["report", "--store", str(store), "-o", str(page)]) == 2
    assert says in _one_line_error(capsys)
    assert not (tmp_path / "out").exists()  # no work began
    if content is None:
        assert not store.exists()
    else:
        assert store.read_bytes() == content  # not grown into a database


def test_an_sqlite_file_without_results_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sqlite3

    store = tmp_path / "other.sqlite"
    with sqlite3.connect(store) as db:
        db.execute("create table t (x)")
    before = store.read_bytes()
    assert main(["report", "--store", str(store), "-o", str(tmp_path / "r.html")]) == 2
    assert "without a results table" in _one_line_error(capsys)
    assert store.read_bytes() == before


def test_bench_refuses_a_store_that_is_not_sqlite_before_profiling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "notes.txt"
    store.write_text("my notes\n")
    assert _exit_code(["bench", "--store", str(store)]) == 2
    assert "not a SQLite database" in _one_line_error(capsys)
    assert store.read_text() == "my notes\n"


def _timeline(events: list[Event]) -> Timeline:
    """A timeline of `events` alone: a trace holds nothing else of it."""
    return Timeline(plan="1f1b", step_time=0.0, events=tuple(events), busy=(0.0, 0.0),
                    compute_span=0.0, peak_memory=(0, 0))  # fmt: skip


MS = 1e-3
PREDICTED = [
    Event(0, "0F0", "F", 0 * MS, 1 * MS, 0, 0),
    Event(0, "send 0F0", "send", 1 * MS, 1.2 * MS, 0, 0),
    Event(1, "1F0", "F", 1.2 * MS, 2.2 * MS, 1, 0),
    Event(1, "1BW0", "BW", 2.2 * MS, 4.2 * MS, 1, 0),
    Event(0, "0BW0", "BW", 4 * MS, 6 * MS, 0, 0),
]
MEASURED = [
    Event(0, "0F0", "F", 0 * MS, 2 * MS, 0, 0),
    Event(1, "1F0", "F", 2 * MS, 4 * MS, 1, 0),
    Event(1, "1BW0", "BW", 4 * MS, 8 * MS, 1, 0),
    Event(0, "0BW0", "BW", 9 * MS, 12 * MS, 0, 0),
    Event(0, "optimizer", "optimizer", 12 * MS, 12 * MS, -1, -1),
]


def test_a_trace_reads_back_as_the_timelines_written(tmp_path: Path) -> None:
    path = str(tmp_path / "t.trace.json")
    write_trace(path, ("predicted", _timeline(PREDICTED)), ("measured", _timeline(MEASURED)))
    runs = read_trace(path)
    assert [label for label, _ in runs] == ["predicted", "measured"]
    for (_, got), want in zip(runs, (PREDICTED, MEASURED), strict=True):
        assert [(e.rank, e.name, e.kind, e.stage, e.mb) for e in got] == [
            (e.rank, e.name, e.kind, e.stage, e.mb) for e in want
        ]
        times = [t for e in got for t in (e.start, e.end)]
        assert times == pytest.approx([t for e in want for t in (e.start, e.end)])


def test_a_trainings_trace_is_a_report_without_a_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a user who just trained gets (issue 55: report once needed a bench store): the
    run's timelines charted, each with figures derived by hand from its events, and a
    link to the trace that opens from the page."""
    monkeypatch.chdir(tmp_path)  # no pipecast-out/bench.sqlite here
    trace = tmp_path / "runs" / "lenet5-1f1b-2.measured.trace.json"
    write_trace(str(trace), ("predicted", _timeline(PREDICTED)), ("measured", _timeline(MEASURED)))
    # both as a user types them, relative to where they stand
    assert main(["report", "--trace", "runs/" + trace.name, "-o", "out/report.html"]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Run: lenet5-1f1b-2.measured" in md and "## Results" not in md
    # busy: F and BW per rank; idle: 1 - busy / (2 ranks x the last action's end)
    assert "| predicted | 2 | 6.00 ms | 3.00 ms, 3.00 ms | 50% |" in md  # 1 - 6/12
    assert "| measured | 2 | 12.00 ms | 5.00 ms, 6.00 ms | 54% |" in md  # 1 - 11/24
    chart = tmp_path / "out" / "report_files" / "run_lenet5-1f1b-2.measured.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "out" / "report.html").read_text()
    href = re.search(r'<a href="([^"]+)">', page)
    assert href is not None and (tmp_path / "out" / href.group(1)).resolve() == trace.resolve()


def test_report_with_nothing_to_report_names_the_command_for_the_last_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    trace = tmp_path / "pipecast-out" / "lenet5-1f1b-2.measured.trace.json"
    write_trace(str(trace), ("measured", _timeline(MEASURED)))
    before = sorted(tmp_path.rglob("*"))
    assert main(["report"]) == 2
    err = _one_line_error(capsys)
    assert "no results store at pipecast-out/bench.sqlite" in err
    assert "`pipecast report --trace pipecast-out/lenet5-1f1b-2.measured.trace.json`" in err
    assert sorted(tmp_path.rglob("*")) == before


def test_a_trace_that_is_not_one_is_one_line_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "rec.json"
    other.write_text('{"kind": "recommendation", "ranked": []}')
    page = tmp_path / "out" / "report.html"
    assert main(["report", "--trace", str(other), "-o", str(page)]) == 2
    assert "holds a 'recommendation' document, not a trace" in _one_line_error(capsys)
    assert not (tmp_path / "out").exists()
