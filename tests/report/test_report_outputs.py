"""`pipecast report` reads every file it is given before it makes anything, and a report
that fails part way (a full disk) is one line, exit 2, and leaves no images' folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.limits import file_size_limit

import pipecast.report.html  # noqa: F401  (matplotlib and its fonts loaded before any limit)
from pipecast.cli.main import main

SHIPPED = str(
    Path(__file__).parents[2] / "src/pipecast/values/profile/shipped/h100/resnet50-imagenet.json"
)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    said = capsys.readouterr()
    return code, said.out + said.err


def _refused(argv: list[str], message: str, tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = sorted(tmp.rglob("*"))
    code, said = _run(argv, capsys)
    assert code == 2, said
    assert message in said and len(said.strip().splitlines()) == 1, said
    assert "Traceback" not in said
    assert sorted(tmp.rglob("*")) == before, "the report made something"


@pytest.fixture
def inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # the default page, pipecast-out/report.html, lands here
    (tmp_path / "rec.json").write_text(json.dumps({"ranked": [], "batch": 8}))
    (tmp_path / "cluster.json").write_text(json.dumps({"kind": "cluster", "version": 1}))
    (tmp_path / "p2p.json").write_text(json.dumps({"p2p": {"0->1": [[1, "fast"]]}}))
    return tmp_path


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--probe", "missing.json"], "file not found: missing.json"),
        (["--profile", "rec.json"], "rec.json holds JSON without a 'kind', not a 'profile'"),
        (["--probe", "cluster.json"], "holds a 'cluster' document, not raw probe samples"),
        (["--probe", "p2p.json"], "p2p.json has damaged point-to-point samples"),
        (["--profile", SHIPPED, "--probe", "missing.json"], "file not found: missing.json"),
    ],
)
def test_a_file_the_report_cannot_use_is_one_line_and_makes_nothing(
    argv: list[str], message: str, inputs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _refused(["report", *argv], message, inputs, capsys)


def test_a_probe_without_samples_says_so_on_the_page(
    inputs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (inputs / "one.json").write_text(json.dumps({"p2p": {}, "allreduce": {}}))
    code, said = _run(["report", "--probe", "one.json", "-o", "page.html"], capsys)
    assert code == 0, said
    page = (inputs / "page.html").read_text()
    assert "one.json holds no point-to-point samples" in page
    assert "one.json holds no point-to-point samples" in (inputs / "page.md").read_text()


def test_a_report_that_cannot_be_written_leaves_no_folder(
    inputs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The images are written first: the first that does not fit ends the report, and the
    images' folder it made goes with it."""
    argv = ["report", "--profile", SHIPPED, "-o", "page.html"]
    with file_size_limit(2048):
        _refused(argv, "cannot write page_files/profile_resnet50-imagenet.png", inputs, capsys)
    assert not (inputs / "page_files").exists()
