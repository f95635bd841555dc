"""min_max_split fills a group's every end at once from a matrix of its rows (issue 67: a
deep pipeline's split made thousands of small steps). The same comparisons make the same
split: checked against the row-at-a-time search on costs full of ties (small integers)
and of groups that are not allowed (inf), and against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pipecast.planning.partition.balance import min_max_split


def _costs(rng: np.random.Generator, n: int, groups: int) -> list[np.ndarray]:
    """Per group, [stop, i]: a small integer or inf for i < stop, garbage (even NaN) past it."""
    out = []
    for _ in range(groups):
        m = rng.integers(1, 6, size=(n + 1, n)).astype(float)
        m[rng.random((n + 1, n)) < 0.2] = np.inf
        m[np.arange(n)[None, :] >= np.arange(n + 1)[:, None]] = rng.choice([np.nan, -5.0])
        out.append(m)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_the_matrix_split_is_the_row_split(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 10))
    groups = int(rng.integers(1, n + 1))
    costs = _costs(rng, n, groups)

    def row(stop: int, group: int) -> np.ndarray:
        return costs[group][stop, :stop]

    want = min_max_split(n, groups, row)
    got = min_max_split(n, groups, row, lambda group: costs[group])
    assert got == want
    if want[0]:  # the least largest cost, by brute force
        every = [
            max(costs[g][b, a] for g, (a, b) in enumerate(itertools.pairwise([0, *cuts, n])))
            for cuts in itertools.combinations(range(1, n), groups - 1)
        ]
        assert want[1] == min(every)
    else:
        assert want[1] == float("inf")
