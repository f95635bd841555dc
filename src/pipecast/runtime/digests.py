"""Files written with their sha256, so that a reader can tell a file from a damaged one.

A checkpoint's files are written by every rank and read back by a later run, perhaps on
other nodes and after a crash: a file cut short or overwritten in place would otherwise load
as garbage (torch.load fails deep inside its unpickler) or, worse, as wrong weights.
`save` hashes a file as torch writes it (the bytes are never read back) and leaves the digest
beside it in `NAME.sha256`; the checkpoint's meta.json, written last, collects them.

Reading a file back to check it costs a pass over it, so each process remembers the digests
it has computed, by path, size and modification time: a run asks for the newest checkpoint
several times, and the launcher hands what it checked to the ranks it starts (`known`,
`trust`), so that a local run reads each file once, not once a rank.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

import torch

SUFFIX = ".sha256"
CHUNK = 1 << 22

Key = tuple[str, int, int]
"""(path, size in bytes, modification time in ns): a file as it stands on disk."""

_computed: dict[Key, str] = {}


class _Hashing:
    """A file object that hashes what passes through it on the way to `out`."""

    def __init__(self, out: BinaryIO) -> None:
        self.out, self.hash, self.size = out, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        self.size += len(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


def _key(path: Path) -> Key:
    stat = path.stat()
    return (str(path.resolve()), stat.st_size, stat.st_mtime_ns)


def save(obj: object, path: Path) -> None:
    """torch.save `obj` to `path` atomically (a reader sees the old file or the whole new
    one), its sha256 and size in `path.sha256` beside it."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        hashing = _Hashing(f)
        torch.save(obj, hashing)  # type: ignore[arg-type]
    digest = hashing.hash.hexdigest()
    os.replace(tmp, path)
    _computed[_key(path)] = digest
    side = path.with_name(path.name + SUFFIX)
    side_tmp = side.with_name(side.name + ".tmp")
    side_tmp.write_text(f"{digest} {hashing.size}\n")
    os.replace(side_tmp, side)


def written(path: Path) -> tuple[str, int] | None:
    """The digest and size `save` left beside `path` (None: none there, or unreadable)."""
    try:
        digest, size = (path.with_name(path.name + SUFFIX)).read_text().split()
        return digest, int(size)
    except (OSError, ValueError):
        return None


def digest(path: Path) -> str:
    """`path`'s sha256, read from disk unless this process has it for the file as it
    stands (same size and modification time)."""
    key = _key(path)
    if key not in _computed:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(CHUNK):
                h.update(block)
        _computed[key] = h.hexdigest()
    return _computed[key]


def known() -> dict[Key, str]:
    """Every digest this process has computed, for `trust` in another process."""
    return dict(_computed)


def trust(digests: Mapping[Key, str]) -> None:
    """Take another process's digests as this one's (files it checked on the same disk; a
    file changed since then has another size or modification time, and is read again)."""
    _computed.update(digests)
