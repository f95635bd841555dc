"""The one checked way pipecast writes a file (jsonio.write_atomic): only over a regular file
or onto a new path, by a rename once the new file is complete; anything else, and any write
that fails, is a one-line DataError that leaves the path as it was."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.limits import file_size_limit

from pipecast import jsonio
from pipecast.errors import DataError


def snapshot(path: Path) -> tuple[object, ...]:
    """What `path` is, without following a link: its type, and a link's target, a file's
    bytes or a directory's names."""
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        return ("link", os.readlink(path))
    if stat.S_ISDIR(mode):
        return ("dir", sorted(p.name for p in path.iterdir()))
    if stat.S_ISREG(mode):
        return ("file", path.read_bytes())
    return (stat.S_IFMT(mode),)


def link(tmp_path: Path) -> Path:
    (tmp_path / "precious.txt").write_text("kept\n")
    (tmp_path / "out.json").symlink_to(tmp_path / "precious.txt")
    return tmp_path / "out.json"


def dangling(tmp_path: Path) -> Path:
    (tmp_path / "out.json").symlink_to(tmp_path / "nowhere" / "x.json")
    return tmp_path / "out.json"


def fifo(tmp_path: Path) -> Path:
    os.mkfifo(tmp_path / "out.json")
    return tmp_path / "out.json"


def folder(tmp_path: Path) -> Path:
    (tmp_path / "out.json").mkdir()
    (tmp_path / "out.json" / "inside.txt").write_text("kept\n")
    return tmp_path / "out.json"


NOT_FILES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "link": (link, "is a symbolic link: pipecast writes only a regular file or a new path"),
    "dangling link": (dangling, "is a symbolic link"),
    "fifo": (fifo, "is a FIFO (named pipe)"),
    "folder": (folder, "is a directory: name a file to write"),
}


@pytest.mark.parametrize("case", NOT_FILES)
def test_what_is_not_a_regular_file_is_left_as_it_was(case: str, tmp_path: Path) -> None:
    make, message = NOT_FILES[case]
    path = make(tmp_path)
    before = {p: snapshot(p) for p in tmp_path.iterdir()}
    assert jsonio.why_not_output(path) is not None
    with pytest.raises(DataError, match=re.escape(message)) as err:
        jsonio.write_atomic(path, '{"kind": "profile"}')
    assert "\n" not in str(err.value)
    assert {p: snapshot(p) for p in tmp_path.iterdir()} == before  # no temporary file either
    if case == "link":
        assert (tmp_path / "precious.txt").read_text() == "kept\n"


def test_a_regular_file_is_replaced_whole_and_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    path.write_text("old\n")
    path.chmod(0o640)
    jsonio.write_atomic(path, "new\n")
    assert path.read_text() == "new\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    jsonio.write_atomic(tmp_path / "sub" / "new.png", b"\x89PNG")  # a new path, folders made
    assert (tmp_path / "sub" / "new.png").read_bytes() == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "sub"]  # no .tmp left


def test_a_write_that_fails_is_one_line_and_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    path.write_text("old\n")
    with file_size_limit(64), pytest.raises(DataError, match=r"cannot write .*out\.json: File too"):
        jsonio.write_atomic(path, "x" * 4096)
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_a_device_is_named_as_one() -> None:
    """Only looked at, never written: /dev/null is a character device on every Linux."""
    why = jsonio.why_not_output("/dev/null")
    assert why is not None and why.startswith("/dev/null is a character device:"), why
