"""What-if: the eight 4 x H100 runs re-predicted with the simulator's two opt-in terms for
compute held behind sends (simulate.costs.Costs): a host at most `launch_queue` actions ahead
of its device, and sends that begin only once their receiver's host reaches the consuming
action while holding their sender's device (`hold_sends`). Where a plan cannot finish under
the strict hold (a rank's device waits for a receive that waits on it), that configuration
keeps its plain prediction, and the count is printed. CPU only; output:
results/held-sends-whatif.txt.

    cd benchmarks && python3 held_sends_whatif.py > results/held-sends-whatif.txt
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from combine import repredicted, run_profiles

import pipecast.recommend.predict as predict_module
from pipecast.bench.accuracy import comparisons, summary
from pipecast.errors import ConfigError

RUNS = [f"h100x4-run{i}" for i in range(1, 9)]
SETTINGS = ((0, False), (1, True), (2, True), (3, True), (2, False))
WATCHED = (
    "resnet18/imagenet b128 pipecast 1f1b 4st M=4",
    "vgg16/cifar10 b128 pipecast gpipe 4st M=16",
    "resnet50/imagenet b128 pipecast 1f1b 4st M=8 pipecast",
    "vgg16/imagenet b128 pipecast 1f1b 4st M=8 same",
)


def main() -> None:
    results = Path(__file__).resolve().parent / "results"
    plain_costs, plain_simulate = predict_module.costs_from_profile, predict_module.simulate
    profiles = {run: run_profiles(results / run) for run in RUNS}
    stuck = 0

    def run_all(queue: int, hold: bool) -> dict[str, Any]:
        nonlocal stuck

        def costs(*args: Any, **kwargs: Any) -> Any:
            return replace(plain_costs(*args, **kwargs), launch_queue=queue, hold_sends=hold)

        def simulate(plan: Any, c: Any, **kwargs: Any) -> Any:
            nonlocal stuck
            try:
                return plain_simulate(plan, c, **kwargs)
            except ConfigError:
                stuck += 1
                return plain_simulate(plan, replace(c, launch_queue=0, hold_sends=False))

        predict_module.costs_from_profile = costs  # type: ignore[assignment]
        predict_module.simulate = simulate  # type: ignore[assignment]
        try:
            return {run: comparisons(repredicted(results / run, profiles[run])) for run in RUNS}
        finally:
            predict_module.costs_from_profile = plain_costs  # type: ignore[assignment]
            predict_module.simulate = plain_simulate  # type: ignore[assignment]

    print("median |error| per run (%); worst; the watched rows' signed errors on runs 4-8")
    for queue, hold in SETTINGS:
        stuck = 0
        comps = run_all(queue, hold)
        sums = {run: summary(c) for run, c in comps.items()}
        medians = " ".join(f"{100 * float(sums[r]['median_abs_error']):5.1f}" for r in RUNS)
        worst = max(float(s["worst_abs_error"]) for s in sums.values())
        picks = sum(int(s["right"]) for s in sums.values())
        print(
            f"launch_queue={queue} hold_sends={hold!s:5}: {medians} | worst {100 * worst:.1f}% "
            f"| picks {picks} | plans stuck under the hold {stuck}"
        )
        for label in WATCHED:
            errors = [
                next((f"{x.error:+.0%}" for x in comps[r] if x.label == label), "-")
                for r in RUNS[3:]
            ]
            print(f"    {label}: {' '.join(errors)}")


if __name__ == "__main__":
    main()
