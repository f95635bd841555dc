"""Every verb's output is a regular file or a new path: one that is a link, a FIFO or a
folder is refused with one line and exit 2 before any work, and left exactly as it was
(the files a verb names inside --out-dir too). Each test makes its own link, FIFO and folder
in a temporary folder."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.cli.stand_ins import WORK, stand_in_work

from pipecast.cli.main import main

SHIPPED = str(
    Path(__file__).parents[2] / "src/pipecast/values/profile/shipped/h100/resnet50-imagenet.json"
)
STEM = "resnet50-1f1b-2"
"""The shipped profile's model, the default schedule and 2 stages, as verbs name files."""


@pytest.fixture(autouse=True)
def no_work(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    also = ("simulate_verb.predict", "partition_verb.partition")
    targets = [t for t in WORK if "basis_for" not in t] + [f"pipecast.cli.{t}" for t in also]
    stand_in_work(monkeypatch, tmp_path, [*targets, "pipecast.report.html.Store"])


def snapshot(root: Path) -> dict[Path, tuple[object, ...]]:
    """Everything under `root`, without following links: each path's type and a link's
    target, a file's bytes or a FIFO's mode."""
    out: dict[Path, tuple[object, ...]] = {}
    for path in sorted(root.rglob("*")):
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            out[path] = ("link", os.readlink(path))
        elif stat.S_ISREG(mode):
            out[path] = ("file", path.read_bytes())
        else:
            out[path] = (stat.S_IFMT(mode), stat.S_IMODE(mode))
    return out


def make_link(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / "precious.txt").write_text("not pipecast's\n")
    path.symlink_to(path.parent / "precious.txt")
    return "is a symbolic link: pipecast writes only a regular file or a new path"


def make_fifo(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return "is a FIFO (named pipe)"


def make_folder(path: Path) -> str:
    path.mkdir(parents=True)
    (path / "inside.txt").write_text("not pipecast's\n")
    return "is a directory"


MAKERS: dict[str, Callable[[Path], str]] = {
    "link": make_link,
    "fifo": make_fifo,
    "folder": make_folder,
}

CASES: dict[str, tuple[list[str], str]] = {
    # the argv, {out} standing for the path made; and that path, relative to tmp_path
    "partition -o": (["partition", "--profile", SHIPPED, "--stages", "2", "-o", "{out}"], "p.json"),
    "partition --export": (
        ["partition", "--profile", SHIPPED, "--stages", "2", "--export", "torch"],
        f"pipecast-out/{STEM}.split.py",
    ),
    "probe --describe -o": (["probe", "--describe", "-o", "{out}"], "c.json"),
    "probe --raw": (["probe", "--raw", "{out}"], "raw.json"),
    "profile -o": (["profile", "--model", "lenet5", "-o", "{out}"], "prof.json"),
    "recommend -o": (["recommend", "-o", "{out}"], "rec.json"),
    "bench --store": (["bench", "--store", "{out}"], "bench.sqlite"),
    "simulate chart": (
        ["simulate", "--profile", SHIPPED, "--stages", "2"],
        "pipecast-out/resnet50-1f1b-2x8.png",
    ),
    "simulate trace": (
        ["simulate", "--profile", SHIPPED, "--stages", "2", "--out-dir", "out"],
        "out/resnet50-1f1b-2x8.trace.json",
    ),
    "train trace": (
        ["train", "--model", "lenet5", "--device", "cpu", "--gpus", "2", "--partition", "0,6,12"],
        "pipecast-out/lenet5-1f1b-2.measured.trace.json",
    ),
    "report page": (["report", "--profile", SHIPPED, "-o", "{out}"], "page.html"),
    "report markdown": (["report", "--profile", SHIPPED, "-o", "page.html"], "page.md"),
}


@pytest.fixture
def reader() -> Iterator[list[int]]:
    """Descriptors of FIFOs opened for reading, without waiting: a write through a FIFO
    then neither hangs the test nor goes unseen."""
    fds: list[int] = []
    yield fds
    for fd in fds:
        os.close(fd)


@pytest.mark.parametrize("kind", MAKERS)
@pytest.mark.parametrize("case", CASES)
def test_an_output_that_is_not_a_regular_file_is_refused_and_left_as_it_was(
    case: str,
    kind: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    reader: list[int],
) -> None:
    argv, out = CASES[case]
    path = tmp_path / out
    message = MAKERS[kind](path)
    if kind == "fifo":
        reader.append(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    before = snapshot(tmp_path)
    try:
        code = main([a.replace("{out}", str(path)) for a in argv])
    except SystemExit as exc:  # argparse's own checks
        code = int(exc.code or 0)
    said = capsys.readouterr()
    err = said.err.strip()
    assert code == 2, said
    assert message in err and path.name in err, err
    assert len(err.splitlines()) == 1 and not said.out.strip(), said
    assert snapshot(tmp_path) == before
    if kind == "fifo":  # nothing was written through it: no data (EOF, or none yet)
        with contextlib.suppress(BlockingIOError):
            assert os.read(reader[0], 1) == b""


def test_the_report_images_folder_must_be_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_fifo(tmp_path / "page_files")
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["report", "--profile", SHIPPED, "-o", "page.html"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "page_files is not a directory" in err and len(err.splitlines()) == 1, err
    assert snapshot(tmp_path) == before
