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


def load(
    kind: str, version: int, text: str, source: str = "<string>", *, oldest: int | None = None
) -> JsonDict:
    """Parse `text` and check it is a `kind` document of format `version` (or of any version
    from `oldest` up, which the caller upgrades)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{source} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(doc, dict) or doc.get("kind") != kind:
        if isinstance(doc, dict):
            found = f"a '{doc['kind']}'" if "kind" in doc else "JSON without a 'kind'"
        else:
            found = f"a JSON {type(doc).__name__}"
        raise DataError(f"{source} holds {found}, not a '{kind}': pass a {kind} file")
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
    """Read a file, turning a missing file into a one-line user error."""
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise DataError(f"file not found: {path}") from None
    except IsADirectoryError:
        raise DataError(f"{path} is a directory, expected a file") from None
