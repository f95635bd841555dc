"""Paths a verb will write, checked before any work starts.

A profile takes minutes and a recommendation more; finding at the end that the output cannot
be written loses all of it. So every output path is tried when the arguments are read: a
file must not be a directory (nor a directory a file), and the directory it lands in (or the
nearest one that exists, where the rest is still to be made) must take a new file. The try
creates a hidden file there and removes it at once, since permission bits alone do not tell
(root writes through them; a read-only or pseudo file system refuses root too). Nothing is
left at the output path. A file to write must be a regular one or a new path
(jsonio.why_not_output: a device, a FIFO or a link is never replaced).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from pipecast.errors import ConfigError, DataError
from pipecast.jsonio import why_not_output
from pipecast.orchestration.bench.store import check_writable_store


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _takes_files(directory: Path) -> str | None:
    """None if a file can be created in `directory`, else why not."""
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".pipecast-write-check-")
    except OSError as exc:
        return f"no file can be created in {directory} ({exc.strerror})"
    os.close(fd)
    os.unlink(probe)
    return None


def why_unwritable(path: str, *, directory: bool) -> str | None:
    """None if `path` can be written (a file, or a directory to write into where `directory`),
    else the reason, for a one-line error."""
    target = Path(path)
    try:
        if not directory and (why := why_not_output(path)) is not None:
            return why
        if target.is_symlink() and not target.exists():
            return f"{path} is a symbolic link to nothing: name a directory to write into"
        if target.exists():
            if directory and not target.is_dir():
                what = "a file" if target.is_file() else "not a directory"
                return f"{path} is {what}: name a directory to write into"
            where = target if directory else target.parent
        else:
            where = _nearest_existing(target.parent)
            if not where.is_dir():
                return f"cannot create {path}: {where} is a file, not a directory"
        why = _takes_files(where)
    except OSError as exc:  # a path the file system refuses to look at (too long, a loop)
        return f"cannot write {path}: {exc.strerror}"
    return f"cannot write {path}: {why}" if why else None


def output_file(text: str) -> str:
    """An argparse type for a file to write, checked before anything runs."""
    why = why_unwritable(text, directory=False)
    if why:
        raise argparse.ArgumentTypeError(why)
    return text


def output_dir(text: str) -> str:
    """An argparse type for a directory to write into, checked before anything runs."""
    why = why_unwritable(text, directory=True)
    if why:
        raise argparse.ArgumentTypeError(why)
    return text


def check_output_dir(path: str, flag: str) -> None:
    """A ConfigError unless `path` takes files: for a directory only some options write to."""
    why = why_unwritable(path, directory=True)
    if why:
        raise ConfigError(f"{flag}: {why}")


def store_file(text: str) -> str:
    """An argparse type for a results store: a file to write that, if it holds anything,
    holds a SQLite database (anything else would be overwritten or fail half way)."""
    output_file(text)
    try:
        check_writable_store(text)
    except DataError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
