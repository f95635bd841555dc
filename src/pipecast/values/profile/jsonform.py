"""A Profile's JSON form, read and written from its dataclasses' own fields.

Each field is written as its type says: dicts keyed by micro-batch size with string keys,
tuples as lists, nested dataclasses as objects. A field missing from a file takes its
default, so files written before a field existed still load; one without a default is an
error that names it.

[Note: format versions]
Version 3 names the measured sizes "micro_batch_sizes" (version 2: "micro_batches", a name
that elsewhere counts micro-batches). Version 2 keeps the host's readings in one object
("host": HostReadings). Version 1 kept them beside everything else, as host_split_call,
host_reference, host_issue, host_machine, host_cpu, host_pooled, size_issue, host_windows and
window_host. `upgrade` brings an older document to version 3.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from pipecast import jsonio
from pipecast.errors import DataError

FORMAT_VERSION = 3

_V1_HOST = {
    "host_split_call": "split_call",
    "host_reference": "reference",
    "host_issue": "issue",
    "host_machine": "machine",
    "host_cpu": "cpu",
    "host_pooled": "pooled",
    "size_issue": "size_issue",
    "host_windows": "windows",
    "window_host": "window_host",
}


def upgrade(doc: dict[str, Any], version: int) -> dict[str, Any]:
    """A profile document of an earlier format `version` in the current one's shape."""
    out = dict(doc)
    if version < 2:
        out = {k: v for k, v in doc.items() if k not in _V1_HOST}
        out["host"] = {new: doc[old] for old, new in _V1_HOST.items() if old in doc}
    if version < 3 and "micro_batches" in out:
        out["micro_batch_sizes"] = out.pop("micro_batches")
    out["version"] = FORMAT_VERSION
    return out


def encode(value: Any) -> Any:
    """`value` as JSON data: dataclasses field by field, dict keys as strings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [encode(v) for v in value]
    return value


def decode(cls: type[Any], data: dict[str, Any], where: str) -> Any:
    """An instance of dataclass `cls` from its JSON data (unknown keys ignored)."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            values[f.name] = _value(hints[f.name], data[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise DataError(f"{where} is not a complete profile: missing '{f.name}'")
    return cls(**values)


def _value(kind: Any, data: Any, where: str) -> Any:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if data is None:
            return None
        return _value(next(a for a in args if a is not type(None)), data, where)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return decode(kind, data, where)
    if origin is dict:
        key, item = args
        return {key(k) if key is int else k: _value(item, v, where) for k, v in data.items()}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_value(args[0], v, where) for v in data)
        return tuple(_value(a, v, where) for a, v in zip(args, data, strict=True))
    if kind is float:
        return float(data)
    if kind is int:
        return int(data)
    return data


def dump(profile: Any) -> str:
    return jsonio.dump("profile", FORMAT_VERSION, encode(profile))


def load(cls: type[Any], text: str, source: str) -> Any:
    """A Profile from its JSON text, of this format version or an earlier one."""
    doc = jsonio.load("profile", FORMAT_VERSION, text, source, oldest=1)
    if doc["version"] < FORMAT_VERSION:
        doc = upgrade(doc, doc["version"])
    body = {k: v for k, v in doc.items() if k not in ("kind", "version")}
    try:
        return decode(cls, body, source)
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{source} is not a complete profile: {exc}") from None
