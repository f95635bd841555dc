"""How much host time the runtime spent per action against what the profile priced, run by
run (CPU only): for every host-bound multi-GPU pipecast row of a stored run (the prediction's
busiest host issues work for at least 90% of the step), each rank's measured host seconds
per action (`actions` in the row: the action loop's time per kind over the kind's count,
receives and sends included) over the profile's host cost for that action. Two ratios per
rank and kind:

* `raw`: measured, less the probe's runtime cost per action, over the profile's cost alone;
* `predicted`: measured over what the simulator charged (the profile's cost times the
  probe's host factor, plus its runtime cost per action).

Where the probe's host factor followed the runtime, `predicted` would sit nearer 1 than
`raw`. The first rank is apart: under zero-bubble schedules it waits for gradients, and its
launches wait with its device, so its host time per action is not its cost.

    cd benchmarks && python3 host_per_action.py > results/host-per-action.txt
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path

import common  # noqa: F401  (puts src/ on the path)
from combine import run_profiles

from pipecast.bench.config import BenchConfig
from pipecast.bench.store import Store
from pipecast.hardware.cluster import Cluster
from pipecast.partition import from_boundaries
from pipecast.recommend.predict import PLACEMENT
from pipecast.simulate.costs import costs_from_profile

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = [f"h100x4-run{i}" for i in range(5, 12)] + ["h200x4-run11"]
HOST_BOUND = 0.9


def ratios(run: Path) -> Iterator[tuple[str, int, str, float, float, float]]:
    """(label, rank, kind, raw ratio, predicted ratio, host factor) per host-bound row."""
    profiles = run_profiles(run)
    cluster = Cluster.load(str(run / "cluster.json"))
    for row in Store(run / "bench.sqlite").rows():
        if row.status != "ok" or not row.measured or not row.predicted:
            continue
        cfg = BenchConfig.from_dict(row.config)
        actions = row.measured.get("actions")
        profile = profiles.get(cfg.workload.key)
        if (
            cfg.system != "pipecast"
            or cfg.stages < 2
            or cfg.replicas != 1
            or not actions
            or profile is None
            or float(row.predicted.get("host_share", 0.0)) < HOST_BOUND
        ):
            continue
        part = from_boundaries(
            list(cfg.boundaries), placement=PLACEMENT.get(cfg.schedule, "one"), ranks=cfg.stages
        )
        # what the simulator charged each stage (the first stage's B its whole backward),
        # and the factor it applied to the profile's prices
        costs = costs_from_profile(profile, part, cfg.batch // cfg.microbatches, cluster)
        busy = len({st.devices[0] for st in part.stages})
        factor = cluster.host_factor(min(busy, cluster.gpus_per_node), profile.host_issue)
        runtime = costs.host_overhead
        for rank in range(cfg.stages):
            # a rank holding several stages (interleaved, ZB-V) runs as many of each
            held = [costs.stages[s] for s, st in enumerate(part.stages) if st.devices[0] == rank]
            for kind in ("F", "B", "W", "BW"):
                charged = statistics.fmean(getattr(st, _HOST[kind]) for st in held)
                count = actions[f"count_{kind}"][rank]
                if not count or charged <= 0:
                    continue
                measured = actions[f"host_{kind}"][rank] / count
                yield (
                    cfg.label(),
                    rank,
                    kind,
                    (measured - runtime) / (charged / factor),
                    measured / (charged + runtime),
                    factor,
                )


_HOST = {
    "F": "host_forward",
    "B": "host_backward_input",
    "W": "host_backward_weight",
    "BW": "host_backward",
}


def main() -> None:
    print(
        "host seconds per action, runtime over profile, host-bound multi-GPU pipecast rows;\n"
        "medians per run (raw: less the runtime cost, over the profile alone; predicted: over "
        "what the simulator charged)"
    )
    print(f"{'run':14s} {'rows':>4s} {'factors':>11s} {'first rank':>21s} {'later ranks':>21s}")
    for name in RUNS:
        found = list(ratios(RESULTS / name))
        if not found:
            continue
        first = [r for r in found if r[1] == 0]
        later = [r for r in found if r[1] > 0]
        factors = [r[5] for r in found]

        def pair(rows: list[tuple[str, int, str, float, float, float]]) -> str:
            if not rows:
                return "-"
            raw = statistics.median(r[3] for r in rows)
            pred = statistics.median(r[4] for r in rows)
            return f"raw {raw:.2f} pred {pred:.2f}"

        print(
            f"{name:14s} {len({r[0] for r in found}):4d} "
            f"{min(factors):.2f}-{max(factors):.2f} {pair(first):>21s} {pair(later):>21s}"
        )


if __name__ == "__main__":
    main()
