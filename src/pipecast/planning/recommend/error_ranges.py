"""How far a prediction can be trusted: ranges measured on stored runs, read from data.

[Note: where the ranges come from]
`error_ranges.json` beside this module is written by `python -m benchmarks.accuracy bands`
from the rows of every stored GPU run (benchmarks/results/rows.csv), each re-predicted by
the code of the commit it names, and from CPU ranks' validations (cpu_rows.csv). It holds,
for each regime, the 10th and 90th percentiles of (predicted - measured) / measured step
time rounded outward to whole per cents, the rows they rest on, and the median. No one edits
the numbers by hand: a new run goes into the rows, and the tool writes the file again.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("error_ranges.json")


@cache
def _doc() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DATA.read_text())
    return data


def error_range(regime: str, gpus: str) -> tuple[float, float]:
    """The likely range of a GPU prediction's error: `regime` 'device' or 'host' (what binds
    the step), `gpus` 'one GPU' or 'several GPUs'."""
    low, high = _doc()["error_range"][f"{regime}|{gpus}"]["range"]
    return float(low), float(high)


def cpu_error_range() -> tuple[float, float]:
    low, high = _doc()["cpu_error_range"]["range"]
    return float(low), float(high)


def slower_miss() -> float:
    """How much slower than predicted host-bound steps ran, as a median, where the host had
    slowed to 1.25x or more its reading while profiling."""
    return float(_doc()["slower_miss"]["value"])


def provenance() -> str:
    """Where the ranges come from, in a line."""
    doc = _doc()
    rows = sum(r["rows"] for r in doc["error_range"].values())
    return f"{rows} rows of {len(doc['runs'])} GPU runs, re-predicted at commit {doc['commit']}"
