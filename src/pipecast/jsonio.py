"""Versioned JSON form shared by every data type that flows between modules.

Each saved document is `{"kind": ..., "version": N, ...fields}`; loading checks both so that
a profile is never read as a cluster, and an old file says which version it has.

Every file pipecast writes for its user (JSON, traces, pages, images, scripts) goes through
`write_atomic`, the one path that checks what it replaces.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
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


KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
"""What an output path may be found to be, other than a regular file."""


def why_not_output(path: str | os.PathLike[str]) -> str | None:
    """None where `path` may be written: it does not exist, or it is a regular file (not a
    link to one); else why not, for a one-line error. A write replaces the path by renaming
    a new file over it, which would turn a device, a FIFO or a link into a plain file (and
    `-o /dev/stdout` would print nothing), so those are left as they are."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None  # a new path (a parent that is not a directory is the caller's to name)
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror}"
    if stat.S_ISREG(mode):
        return None
    what = next((name for test, name in KINDS if test(mode)), "not a regular file")
    if stat.S_ISDIR(mode):
        return f"{path} is a directory: name a file to write"
    return (
        f"{path} is {what}: pipecast writes only a regular file or a new path, so name one "
        "(it leaves this one as it is)"
    )


def check_output(path: str | os.PathLike[str]) -> None:
    """A one-line DataError unless `path` may be written (why_not_output)."""
    why = why_not_output(path)
    if why is not None:
        raise DataError(why)


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write `data` (text as UTF-8) to `path`, a regular file or a new path: into a new file
    beside it, renamed over it once complete, so a crash or a full disk never leaves a
    half-written file, and nothing but a regular file is ever replaced (why_not_output).
    A write that fails (no space, no permission) is a one-line DataError, and leaves `path`
    as it was."""
    check_output(path)
    target = Path(path)
    body = data.encode() if isinstance(data, str) else data
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _replace(target, body)
    except OSError as exc:
        raise DataError(f"cannot write {path}: {exc.strerror or exc}") from None


def _replace(target: Path, body: bytes) -> None:
    """`body` into a file of its own beside `target` (created new, so never through a link
    someone left at a fixed name), then renamed over `target`; the file keeps the mode of
    the one it replaces."""
    fd, tmp = _new_beside(target)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(body)
        with contextlib.suppress(FileNotFoundError):  # a new path: the umask's mode
            os.chmod(tmp, stat.S_IMODE(os.stat(target).st_mode))
        check_output(target)  # made something else meanwhile: leave it
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _new_beside(target: Path) -> tuple[int, str]:
    """A new, empty file in `target`'s directory (mode 0o666 less the umask), open for
    writing: its descriptor and path."""
    while True:
        tmp = str(target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp"))
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


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
