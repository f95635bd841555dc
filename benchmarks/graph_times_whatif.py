"""Would graph replay times make better eager predictions? Runs whose profiles time graph
replays (ProfileOptions.graph_times) re-predicted three ways: as profiled, with eager device
times swapped for graph replay times where the host's issuing could not be hidden
(`issue_hidden` false: GPT, ResNet-50, ResNet-152), and everywhere (CPU only).

    cd benchmarks && python3 graph_times_whatif.py results/h100x4-run12 \
        results/h100x2-graphs-run1 results/h100x2-graphs-run2 > results/graph-times-whatif.txt
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import common  # noqa: F401  (puts src/ on the path)
from combine import repredicted, run_profiles

from pipecast.bench.accuracy import comparisons, summary
from pipecast.profile.types import Profile


def graph_device_times(p: Profile) -> Profile:
    """`p` with every block's device times its graph replay times (B and W keep their
    split's proportions)."""
    blocks = []
    for b in p.blocks:
        costs = {}
        for mb, c in b.costs.items():
            scale = c.graph_backward / c.backward if c.backward > 0 else 1.0
            costs[mb] = replace(
                c,
                forward=c.graph_forward,
                backward=c.graph_backward,
                backward_input=c.backward_input * scale,
                backward_weight=c.backward_weight * scale,
            )
        blocks.append(replace(b, costs=costs))
    return replace(p, blocks=tuple(blocks))


WAYS: list[tuple[str, Callable[[Profile], bool]]] = [
    ("as profiled", lambda p: False),
    ("graph times where not hidden", lambda p: p.graph_times and not p.issue_hidden),
    ("graph times everywhere", lambda p: p.graph_times),
]


def main() -> None:
    for arg in sys.argv[1:]:
        run = Path(arg)
        base = run_profiles(run)
        for name, swap in WAYS:
            profiles = {k: graph_device_times(p) if swap(p) else p for k, p in base.items()}
            s = summary(comparisons(repredicted(run, profiles)))
            print(
                f"{run.name:20s} {name:30s} median {s['median_abs_error']:.1%} worst "
                f"{s['worst_abs_error']:.1%}, {s['within_20_percent']}/{s['configurations']} "
                f"within 20%; device-bound median {s['device_bound_median_abs_error']:.1%}, "
                f"host-bound median {s['host_bound_median_abs_error']:.1%}; picks "
                f"{s['right']}/{s['decisions']}"
            )


if __name__ == "__main__":
    main()
