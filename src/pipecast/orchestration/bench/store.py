"""The results store: one SQLite file, a row per benchmark configuration.

Rows are written as each configuration completes (or fails), so a suite that dies part way
keeps what it measured and resumes where it stopped. Each row holds the configuration, the
environment (card, torch version, commit), the measurements and the predictions.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipecast.errors import DataError

SCHEMA = """
create table if not exists results (
    key text primary key,
    suite text not null,
    status text not null,          -- ok | failed | started
    config text not null,          -- JSON
    environment text not null,     -- JSON: card, torch, commit, host
    measured text,                 -- JSON: step_time, samples_per_second, memory, loss, ...
    predicted text,                -- JSON: step_time, peak_memory, bubble, ...
    error text,
    updated real not null
);
"""


@dataclass(frozen=True)
class Row:
    key: str
    suite: str
    status: str
    config: dict[str, Any]
    environment: dict[str, Any]
    measured: dict[str, Any] | None
    predicted: dict[str, Any] | None
    error: str | None


SQLITE_HEADER = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database file."""


def check_writable_store(path: str | Path) -> None:
    """A store `pipecast bench` may write: absent, empty (SQLite starts it), or an SQLite
    file; anything else would be overwritten or fail after the suite ran."""
    p = Path(path)
    if p.is_dir():
        raise DataError(f"{p} is a directory, expected a results store (a .sqlite file)")
    if not p.is_file() or not p.stat().st_size:
        return
    with open(p, "rb") as fh:
        head = fh.read(len(SQLITE_HEADER))
    if head != SQLITE_HEADER:
        raise DataError(
            f"{p} is not a results store: it holds {_what_bytes(head)}, not a SQLite database "
            "(name a new file, or the store an earlier `pipecast bench --store` wrote)"
        )


def _is_sqlite(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(len(SQLITE_HEADER)) == SQLITE_HEADER


def _what_bytes(head: bytes) -> str:
    """What a file's first bytes look like, for a message: JSON, text or binary data."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return "binary data"
    return "JSON" if text.lstrip()[:1] in ("{", "[") else "text"


class Store:
    def __init__(self, path: str | Path, *, read_only: bool = False) -> None:
        """The store at `path`, created if missing; `read_only`: one that exists and holds
        results, opened without writing to it (DataError otherwise)."""
        self.path = Path(path)
        self.read_only = read_only
        if read_only:
            self._check_readable()
            return
        check_writable_store(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(self._connect()) as db, db:
            db.executescript(SCHEMA)

    def _check_readable(self) -> None:
        p = self.path
        fix = "run `pipecast bench` first, or name the store it wrote with --store"
        if not p.exists():
            raise DataError(f"no results store at {p}: {fix}")
        if p.is_dir():
            raise DataError(f"{p} is a directory, expected a results store (a .sqlite file)")
        if not p.stat().st_size:
            raise DataError(f"{p} is empty, not a results store: {fix}")
        if not _is_sqlite(p):
            raise DataError(f"{p} is not an SQLite file, so not a results store: {fix}")
        try:
            with closing(self._connect()) as db:
                found = db.execute(
                    "select name from sqlite_master where type = 'table' and name = 'results'"
                ).fetchone()
        except sqlite3.DatabaseError as exc:
            raise DataError(f"{p} is not a readable results store ({exc}): {fix}") from None
        if found is None:
            raise DataError(f"{p} is an SQLite file without a results table: {fix}")

    def _connect(self) -> sqlite3.Connection:
        if self.read_only:
            return sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
        return sqlite3.connect(self.path, timeout=30)

    def done(self, key: str) -> bool:
        """Whether `key` finished (ok or failed): a resumed suite skips it."""
        with closing(self._connect()) as db:
            row = db.execute("select status from results where key = ?", (key,)).fetchone()
        return row is not None and row[0] in ("ok", "failed")

    def put(
        self,
        key: str,
        suite: str,
        status: str,
        config: dict[str, Any],
        environment: dict[str, Any],
        measured: dict[str, Any] | None = None,
        predicted: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        with closing(self._connect()) as db, db:
            db.execute(
                "insert or replace into results values (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    key,
                    suite,
                    status,
                    json.dumps(config),
                    json.dumps(environment),
                    json.dumps(measured) if measured is not None else None,
                    json.dumps(predicted) if predicted is not None else None,
                    error,
                    time.time(),
                ),
            )

    def status(self, key: str) -> str | None:
        """ok, failed, started, or None for a configuration never begun."""
        with closing(self._connect()) as db:
            row = db.execute("select status from results where key = ?", (key,)).fetchone()
        return str(row[0]) if row else None

    def row(self, key: str) -> Row | None:
        """The record of `key`, or None."""
        return next(self.rows(key=key), None)

    def rows(
        self, suite: str | None = None, status: str | None = None, *, key: str | None = None
    ) -> Iterator[Row]:
        query, params = "select * from results where 1=1", []
        if key:
            query += " and key = ?"
            params.append(key)
        if suite:
            query += " and suite = ?"
            params.append(suite)
        if status:
            query += " and status = ?"
            params.append(status)
        with closing(self._connect()) as db:
            for r in db.execute(query + " order by updated", params).fetchall():
                yield Row(
                    r[0],
                    r[1],
                    r[2],
                    json.loads(r[3]),
                    json.loads(r[4]),
                    json.loads(r[5]) if r[5] else None,
                    json.loads(r[6]) if r[6] else None,
                    r[7],
                )


def environment(device: str = "cpu", *, threads: int | None = None) -> dict[str, Any]:
    """Where a group of rows ran: the card (a GPU's name; on CPU ranks "CPU", the CPU's
    model and the threads each rank computed with), the devices, torch, the commit, the
    host."""
    import platform

    import torch

    from pipecast.measuring.hostspeed import cpu_model
    from pipecast.runtime import devices

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    dev = devices.resolve(device)
    out: dict[str, Any] = {
        "card": devices.name(dev),
        "devices": torch.cuda.device_count() if dev.type == "cuda" else 1,
        "torch": torch.__version__,
        "commit": commit,
        "host": platform.node(),
    }
    if dev.type == "cpu":
        threads = threads or torch.get_num_threads()
        out["threads"] = threads
        out["card"] = f"CPU {cpu_model() or 'unknown'}, {threads} thread(s) a rank"
    return out
