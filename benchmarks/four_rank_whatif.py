"""Would a larger host factor for four busy ranks serve? `signed_bias.py` finds host-bound
pipelines over 4 GPUs predicted fast by a median 4.8% (H100) and 10.0% (H200) where those
over 2 sit near 0, run after run. This re-predicts every stored run whose probe read the host
issue (as `host_factor_whatif.py` does) with the probe's ratio, never below 1 (its
`clamped` variant), times K where four or more ranks are busy, for K in 1, 1.05, 1.10 and
1.15 (CPU only; output: results/four-rank-whatif.txt).

Written after h200x4-run16 and fitted to every run it prints, so in sample: a K that helped
here would still need a fresh run to decide it. Each line: K, rows within 20% over all
runs, the same over the H100 runs from 13 and the H200 runs from 12 (repeatability.GROUPS),
the signed median of their host-bound 4-GPU rows, and their worst rows, run by run.

    cd benchmarks && python3 four_rank_whatif.py > results/four-rank-whatif.txt
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from combine import repredicted
from error_bands import RUNS
from host_factor_whatif import MEASURED, clamped
from repeatability import GROUPS

from pipecast.bench.accuracy import comparisons, summary
from pipecast.hardware.cluster import Cluster

RESULTS = Path(__file__).resolve().parent / "results"


def scaled(k: float) -> Callable[..., float]:
    def factor(self: Cluster, busy: int, profiled_issue: float = 0.0, on: str = "") -> float:
        return clamped(self, busy, profiled_issue, on) * (k if busy >= 4 else 1.0)

    return factor


def main() -> None:
    recent = {run for runs in GROUPS.values() for run in runs}
    for k in (1.0, 1.05, 1.10, 1.15):
        Cluster.host_factor = scaled(k)  # type: ignore[method-assign]
        within = rows = within_recent = 0
        worst: list[str] = []
        four: list[float] = []
        for run in RUNS:
            if not Cluster.load(str(RESULTS / run / "cluster.json")).host_issue:
                continue
            comps = comparisons(repredicted(RESULTS / run))
            s = summary(comps)
            within += int(s["within_20_percent"])
            rows += int(s["configurations"])
            if run in recent:
                within_recent += int(s["within_20_percent"])
                worst.append(f"{s['worst_abs_error']:.1%}")
                four += [c.error for c in comps if c.host_share >= 0.5 and c.gpus == 4]
        print(
            f"K {k:.2f}: {within} of {rows} within 20%; runs from 13/12: {within_recent}, "
            f"host-bound 4-GPU signed median {statistics.median(four):+.1%}, "
            f"worst rows {' '.join(worst)}",
            flush=True,
        )
    Cluster.host_factor = MEASURED  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
