"""Splitting a sequence of blocks into contiguous groups: the core every method shares.

`min_max_split` finds, exactly, the split that minimises the largest group cost, by dynamic
programming over (groups, end block). A group's cost may be any function of its range and
position, so boundary communication and per-position memory limits fit the same recurrence.
Costs come a row at a time (every start for one end) as numpy vectors, which keeps a
152-block, 8-stage split in milliseconds.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np

from pipecast.errors import ConfigError

RowCost = Callable[[int, int], np.ndarray]
"""row(stop, group) -> cost of groups [i, stop) for every i in 0..stop-1 (inf: not allowed)."""


MatrixCost = Callable[[int], np.ndarray]
"""matrix(group) -> [stop, i]: cost of group [i, stop) for every stop in 0..n and i < stop
(every row of a RowCost at once; entries i >= stop are not read)."""


def min_max_split(
    n: int, groups: int, row: RowCost, matrix: MatrixCost | None = None
) -> tuple[list[int], float]:
    """Boundaries [0, b1, ..., n] of `groups` non-empty contiguous groups that minimise the
    largest cost, and that cost ([] and inf when no split is allowed). `matrix`: the same
    costs as `row`, a group's rows at once, which fill a group's every end in one step
    (the same comparisons, so the same split, ties to the earliest start included)."""
    if groups < 1:
        raise ConfigError(f"need at least 1 stage, got {groups}")
    if groups > n:
        raise ConfigError(
            f"{groups} stages but only {n} blocks: every stage needs a block; "
            f"use at most {n} stages"
        )
    best = np.full((groups + 1, n + 1), np.inf)
    choice = np.zeros((groups + 1, n + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for k in range(1, groups + 1):
        if matrix is not None:
            _fill(best, choice, k, n - (groups - k) + 1, matrix(k - 1))
            continue
        for j in range(k, n - (groups - k) + 1):
            lo = k - 1
            costs = np.asarray(row(j, k - 1), dtype=float)[lo:j]
            values = np.maximum(best[k - 1, lo:j], costs)
            i = int(np.argmin(values))
            best[k, j], choice[k, j] = values[i], lo + i
    if not np.isfinite(best[groups, n]):
        return [], float("inf")
    bounds = [n]
    for k in range(groups, 0, -1):
        bounds.append(int(choice[k, bounds[-1]]))
    return bounds[::-1], float(best[groups, n])


def _fill(best: np.ndarray, choice: np.ndarray, k: int, end: int, costs: np.ndarray) -> None:
    """min_max_split's step for group k over every end j in [k, end) at once: for each j,
    the start i in [k - 1, j) least in max(best[k - 1, i], costs[j, i]), the first of
    equals (np.argmin's, on a row whose entries past j are inf)."""
    lo, n = k - 1, costs.shape[1]
    values = np.maximum(best[k - 1, lo:n], costs[k:end, lo:n])
    starts, ends = np.arange(lo, n), np.arange(k, end)
    values[starts[None, :] >= ends[:, None]] = np.inf  # not a group: i >= j
    first = np.argmin(values, axis=1)
    best[k, k:end] = values[np.arange(len(ends)), first]
    choice[k, k:end] = lo + first


def near_min_max_split(
    n: int, groups: int, row: RowCost, *, slack: float, tie: RowCost
) -> tuple[list[int], float]:
    """Among the splits whose largest `row` cost is at most `slack` above the least
    (min_max_split's), the one whose largest `tie` cost is least (the first such, where
    several are), and its largest `row` cost. Splits that measurements cannot tell apart go
    to a fixed rule rather than to whichever the noise made fastest."""
    bounds, best = min_max_split(n, groups, row)
    if not bounds or slack <= 0:
        return bounds, best
    limit = best + slack

    def allowed(stop: int, group: int) -> np.ndarray:
        costs = np.asarray(row(stop, group), dtype=float)
        return np.where(costs <= limit, np.asarray(tie(stop, group), dtype=float), np.inf)

    tied, _ = min_max_split(n, groups, allowed)  # the least-cost split is among them
    worst = max(float(row(b, k)[a]) for k, (a, b) in enumerate(itertools.pairwise(tied)))
    return tied, worst


def additive_row(values: Sequence[float]) -> RowCost:
    """Row costs for plain additive weights: cost[i, j) = sum(values[i:j])."""
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(values, dtype=float))])

    def row(stop: int, _group: int) -> np.ndarray:
        return np.asarray(prefix[stop] - prefix[:stop], dtype=float)

    return row


def split_sum(values: Sequence[float], groups: int) -> list[int]:
    """Min-max split of additive weights (parameters, forward time, memory, counts)."""
    bounds, _ = min_max_split(len(values), groups, additive_row(values))
    return bounds
