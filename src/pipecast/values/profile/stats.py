"""Robust timing statistics: the median after dropping outliers beyond 1.5 standard
deviations (the background GPipe study's rule), with the spread that remains."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Robust:
    median: float
    spread: float
    """Standard deviation of the kept samples over their median (0 for one sample)."""
    kept: int
    dropped: int


def robust(samples: Sequence[float]) -> Robust:
    """Median of `samples` without those farther than 1.5 sigma from the mean."""
    if not samples:
        raise ValueError("robust() needs at least one sample")
    if len(samples) < 3:
        return Robust(statistics.median(samples), 0.0, len(samples), 0)
    mean = statistics.fmean(samples)
    sigma = statistics.pstdev(samples)
    kept = [s for s in samples if abs(s - mean) <= 1.5 * sigma] if sigma > 0 else list(samples)
    med = statistics.median(kept)
    spread = statistics.pstdev(kept) / med if med > 0 and len(kept) > 1 else 0.0
    return Robust(med, spread, len(kept), len(samples) - len(kept))


def range_spread(samples: Sequence[float]) -> float:
    """(largest - smallest) / median: how far a few repeated measurements lay apart (0 for
    fewer than two)."""
    if len(samples) < 2:
        return 0.0
    mid = statistics.median(samples)
    return (max(samples) - min(samples)) / mid if mid > 0 else 0.0
