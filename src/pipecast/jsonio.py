"""Versioned JSON form shared by every data type that flows between modules.

Each saved document is `{"kind": ..., "version": N, ...fields}`; loading checks both so that
a profile is never read as a cluster, and an old file says which version it has.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pipecast.errors import DataError

JsonDict = dict[str, Any]


def dump(kind: str, version: int, body: JsonDict) -> str:
    """The JSON text of `body` tagged with its kind and format version."""
    return json.dumps({"kind": kind, "version": version, **body}, indent=1, sort_keys=False)


def parse(text: str, source: str = "<string>") -> Any:
    """The value `text` holds, or a one-line DataError naming `source` and where the JSON
    breaks (json's own messages end in 'at', so the position follows without a second one)."""
    if not text.strip():
        raise DataError(f"{source} is empty: expected a JSON document")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        what = exc.msg.removesuffix(" at")
        raise DataError(
            f"{source} is not valid JSON: {what} at line {exc.lineno}, column {exc.colno} "
            "(a truncated or hand-edited file?)"
        ) from None


def describe(doc: object) -> str:
    """What a parsed JSON document is, for messages: "a 'profile' document", "a JSON list"."""
    if isinstance(doc, dict):
        kind = doc.get("kind")
        return f"a '{kind}' document" if isinstance(kind, str) else "JSON without a 'kind'"
    names = {list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return f"a JSON {names.get(type(doc), 'null')}"


def load(
    kind: str, version: int, text: str, source: str = "<string>", *, oldest: int | None = None
) -> JsonDict:
    """Parse `text` and check it is a `kind` document of format `version` (or of any version
    from `oldest` up, which the caller upgrades)."""
    doc = parse(text, source)
    if not isinstance(doc, dict) or doc.get("kind") != kind:
        raise DataError(f"{source} holds {describe(doc)}, not a '{kind}': pass a {kind} file")
    if doc.get("version") not in range(oldest or version, version + 1):
        raise DataError(
            f"{source} is {kind} format version {doc.get('version')}, this pipecast reads "
            f"version {version}: regenerate it with this version"
        )
    return doc


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` so that a crash never leaves a half-written file behind."""
    target = Path(path)
    if target.is_dir():
        raise DataError(f"{path} is a directory: name a file to write")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, target)


def read_text(path: str | os.PathLike[str]) -> str:
    """Read a file of JSON text, turning a missing, unreadable or binary file into a one-line
    user error that names it."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"file not found: {path}") from None
    except IsADirectoryError:
        raise DataError(f"{path} is a directory, expected a file") from None
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{path} holds binary data (byte {exc.object[exc.start]:#04x} at offset "
            f"{exc.start} is not UTF-8 text), not JSON"
        ) from None
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror}") from None
