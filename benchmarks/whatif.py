"""Shared by the what-if scripts: every stored run (error_bands.RUNS) re-predicted under
variants of the code, one line per run and totals per variant (CPU only)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from pathlib import Path

import common  # noqa: F401  (puts src/ on the path)
from combine import repredicted
from error_bands import RUNS

from pipecast.bench.accuracy import Comparison, comparisons

RESULTS = Path(__file__).parent / "results"


def compare(
    variants: Mapping[str, Callable[[], None]], restore: Callable[[], None]
) -> dict[str, list[list[Comparison]]]:
    """Each variant's comparisons run by run: `variants[name]()` patches the code before
    the run is re-predicted, `restore()` puts it back after each run. Prints each run's
    line: per variant its median and worst |error| and its rows within 20%."""
    out: dict[str, list[list[Comparison]]] = {name: [] for name in variants}
    for run in RUNS:
        cells = []
        for name, patch in variants.items():
            patch()
            cs = comparisons(repredicted(RESULTS / run))
            out[name].append(cs)
            errors = [abs(c.error) for c in cs]
            within = sum(e <= 0.2 for e in errors)
            cells.append(f"{name} {statistics.median(errors):6.1%} {max(errors):6.1%} {within:2d}")
        restore()
        print(f"{run:20s} " + " | ".join(cells), flush=True)
    return out


def totals(runs: list[list[Comparison]], base: list[list[Comparison]]) -> str:
    """A variant's rows within 20% of all, and on how many runs its median |error| is
    lower or higher than `base`'s."""

    def median(cs: list[Comparison]) -> float:
        return statistics.median(abs(c.error) for c in cs)

    within = sum(abs(c.error) <= 0.2 for cs in runs for c in cs)
    rows = sum(len(cs) for cs in runs)
    pairs = [(median(v), median(b)) for v, b in zip(runs, base, strict=True)]
    better = sum(m < b - 1e-9 for m, b in pairs)
    worse = sum(m > b + 1e-9 for m, b in pairs)
    return f"{within} of {rows} within 20%; run medians better on {better}, worse on {worse}"
