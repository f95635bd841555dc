"""A Profile's JSON form, read and written from its dataclasses' own fields.

Each field is written as its type says: dicts keyed by micro-batch size with string keys,
tuples as lists, nested dataclasses as objects. A field missing from a file takes its
default, so files written before a field existed still load; one without a default is an
error that names it.

[Note: format versions]
Version 2 keeps the host's readings in one object ("host": HostReadings). Version 1 kept
them beside everything else, as host_split_call, host_reference, host_issue, host_machine,
host_cpu, host_pooled, size_issue, host_windows and window_host; `upgrade` moves them.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from pipecast import jsonio
from pipecast.errors import DataError

FORMAT_VERSION = 2

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


def upgrade(doc: dict[str, Any]) -> dict[str, Any]:
    """A version-1 profile document in version 2's shape."""
    out = {k: v for k, v in doc.items() if k not in _V1_HOST}
    out["host"] = {new: doc[old] for old, new in _V1_HOST.items() if old in doc}
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
    """A Profile from its JSON text, version 1 or 2."""
    try:
        doc = jsonio.load("profile", FORMAT_VERSION, text, source)
    except DataError as exc:
        if "format version 1," not in str(exc):
            raise
        doc = upgrade(jsonio.load("profile", 1, text, source))
    body = {k: v for k, v in doc.items() if k not in ("kind", "version")}
    try:
        return decode(cls, body, source)
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{source} is not a complete profile: {exc}") from None
