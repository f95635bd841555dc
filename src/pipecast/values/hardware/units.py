"""Sizes, rates and durations as people write them ('80GiB', '300GB/s', '5us'), read and
sizes written back."""

from __future__ import annotations

import re

from pipecast.errors import ConfigError

_BYTES = {
    "": 1,
    "b": 1,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "tb": 1e12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SECONDS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_NUMBER = r"\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*"


def parse_bytes(text: str | int | float) -> int:
    """'80GiB' -> 85899345920; plain numbers are bytes."""
    if isinstance(text, int | float):
        return int(text)
    m = re.fullmatch(_NUMBER + r"([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _BYTES:
        raise ConfigError(f"'{text}' is not a size: write e.g. 80GiB, 16GB or 1048576")
    return int(float(m.group(1)) * _BYTES[m.group(2).lower()])


def parse_rate(text: str | int | float) -> float:
    """'300GB/s' -> 3e11 bytes/s; 'Gbit/s' and 'Gbps' are bits."""
    if isinstance(text, int | float):
        return float(text)
    m = re.fullmatch(_NUMBER + r"([a-zA-Z]*)(?:/s|ps)?\s*", text)
    if not m:
        raise ConfigError(f"'{text}' is not a bandwidth: write e.g. 300GB/s or 200Gbit/s")
    unit = m.group(2).lower()
    if unit.endswith("bit") or (text.strip().endswith("bps") and unit.endswith("b")):
        prefix = unit.removesuffix("bit").removesuffix("b")
        scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}.get(prefix)
        if scale is None:
            raise ConfigError(f"'{text}' has an unknown unit")
        return float(m.group(1)) * scale / 8
    if unit not in _BYTES:
        raise ConfigError(f"'{text}' has an unknown unit: write e.g. 300GB/s")
    return float(m.group(1)) * _BYTES[unit]


def parse_seconds(text: str | int | float) -> float:
    """'5us' -> 5e-6; plain numbers are seconds."""
    if isinstance(text, int | float):
        return float(text)
    m = re.fullmatch(_NUMBER + r"([a-zA-Zµ]*)\s*", text)
    if not m or m.group(2).lower() not in _SECONDS:
        raise ConfigError(f"'{text}' is not a duration: write e.g. 5us, 0.2ms or 1e-5")
    return float(m.group(1)) * _SECONDS[m.group(2).lower()]


def human_bytes(n: float) -> str:
    """Bytes in the largest binary unit under which the figure stays below 1024 as printed
    ('512 B', '826.45 KiB', '80.00 GiB'): a size is never shown as 0.00 of a unit too large
    for it (a CPU rank's few hundred KiB, a --memory-limit of 0.001 GiB), nor as 1024.00 of
    one too small."""
    if round(abs(n)) < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if round(abs(n), 2) < 1024:
            return f"{n:.2f} {unit}"
    return f"{n / 1024:.2f} TiB"


def per_rank(cpu: bool) -> str:
    """What a figure of memory per rank is of: a GPU's memory, or on CPU ranks the host's
    memory, which the ranks share (a CPU rank has none of its own)."""
    return "of host memory per rank" if cpu else "per GPU"
