"""`pipecast report -o PAGE`: the page is a file, the Markdown and the images go beside
it, and a bad page or store is one line and exit code 2 before any work."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.report.test_report_in_browser import cpu_store

from pipecast.cli.main import main


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
