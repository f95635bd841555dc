"""Which rows does this code predict fast or slow run after run? The stored 4-GPU runs of
one suite and measuring code (repeatability.GROUPS: H100 runs from 13, H200 runs from 12),
each re-predicted from its own profiles and probe, their signed errors grouped by GPU kind,
what binds the step (host-bound: the host issues work for at least half of it), the GPUs
and the strategy (one GPU, DDP, pipeline). CPU only; output: results/signed-bias.txt.

Each line: the group, its rows, the median of (predicted - measured) / measured and the
rows within 20%. A group whose median sits far from 0 over many runs errs one way by more
than the host's spells, which change sign from run to run.

Then, for host-bound rows over 2 and 4 GPUs, how far apart the ranks' hosts ran: each row
records every rank's hostspeed.issue() reading in each round (`host_issue_rounds`); a
round's spread is its slowest rank's reading over the ranks' median, and a row's the median
over its rounds. The rows are cut into thirds by that spread, with each third's signed
median error: if the slowest rank set the step and the spread followed it, the widest
third would err fastest.

    cd benchmarks && python3 signed_bias.py > results/signed-bias.txt
"""

from __future__ import annotations

import statistics
from typing import Any

from combine import repredicted
from repeatability import GROUPS, RESULTS

from pipecast.bench.accuracy import Comparison, comparisons


def strategy(c: Comparison) -> str:
    if "DDP" in c.label:
        return "DDP"
    return "one GPU" if c.gpus == 1 else "pipeline"


def spread(measured: dict[str, Any]) -> float | None:
    """The median over rounds of the slowest rank's issue reading over the ranks' median."""
    rounds = [r for r in measured.get("host_issue_rounds") or [] if len(r) > 1 and min(r) > 0]
    if not rounds:
        return None
    return statistics.median(max(r) / statistics.median(r) for r in rounds)


def thirds(pairs: list[tuple[float, float]]) -> str:
    """(spread, error) pairs cut into thirds by spread: each third's range and signed median."""
    pairs = sorted(pairs)
    cut = [pairs[i * len(pairs) // 3 : (i + 1) * len(pairs) // 3] for i in range(3)]
    return ", ".join(
        f"{part[0][0]:.3f}-{part[-1][0]:.3f}: {statistics.median(e for _, e in part):+.1%}"
        for part in cut
    )


def main() -> None:
    for kind, runs in GROUPS.items():
        groups: dict[tuple[str, int, str], list[float]] = {}
        spreads: dict[int, list[tuple[float, float]]] = {2: [], 4: []}
        for run in runs:
            rows = [r for r in repredicted(RESULTS / run) if r.status == "ok"]
            rows = [r for r in rows if r.predicted and r.measured]  # as comparisons() keeps
            for row, c in zip(rows, comparisons(rows), strict=True):
                bound = "host" if c.host_share >= 0.5 else "device"
                groups.setdefault((bound, c.gpus, strategy(c)), []).append(c.error)
                s = spread(row.measured or {})
                if bound == "host" and c.gpus in spreads and s is not None:
                    spreads[c.gpus].append((s, c.error))
        print(f"{kind}: {len(runs)} runs ({runs[0]} to {runs[-1]})")
        for (bound, gpus, name), errors in sorted(groups.items()):
            print(
                f"  {bound:6s}-bound {gpus} GPU(s) {name:8s} {len(errors):4d} rows, "
                f"median {statistics.median(errors):+6.1%}, "
                f"{sum(abs(e) <= 0.20 for e in errors):4d} within 20%"
            )
        for gpus, pairs in spreads.items():
            print(
                f"  host-bound over {gpus} GPUs: {len(pairs)} rows, ranks' spread median "
                f"{statistics.median(s for s, _ in pairs):.3f}; by thirds {thirds(pairs)}"
            )


if __name__ == "__main__":
    main()
