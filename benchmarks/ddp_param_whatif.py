"""DDP's host work per parameter tensor, the probe's reading against a fixed 35 us: every
stored run's host-bound data-parallel rows re-predicted both ways (CPU only; output:
results/ddp-param-whatif.txt).

The rule, decided after h200x4-run14 and before h100x4-run18: the fixed cost replaces the
probe's reading (Cluster.ddp_param_host, host_probe.ddp_overhead) if it puts more host-bound
DDP rows within 20% with a worst no higher. 35 us is the per-tensor cost h200x4-run14's
ResNet-50 and ResNet-152 DDP x4 rows asked for; the probe read 12-50 us a tensor over the
runs that read it (0 on h100x4-run18).

    cd benchmarks && python3 ddp_param_whatif.py > results/ddp-param-whatif.txt
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

from combine import repredicted
from error_bands import RUNS

from pipecast.bench.accuracy import Comparison, comparisons
from pipecast.bench.config import BenchConfig
from pipecast.bench.store import Store
from pipecast.hardware.cluster import Cluster

FIXED = 35e-6
RESULTS = Path(__file__).resolve().parent / "results"


def ddp_rows(run: Path, clusters: dict[str, Cluster]) -> dict[str, list[Comparison]]:
    """Per variant, the run's rows of data parallelism alone (no pipeline) that are
    host-bound under either variant: the same rows both ways."""
    ddp = {
        BenchConfig.from_dict(r.config).label()
        for r in Store(run / "bench.sqlite").rows()
        if BenchConfig.from_dict(r.config).system == "ddp"
    }
    rows = {
        n: [c for c in comparisons(repredicted(run, cluster=cl)) if c.label in ddp]
        for n, cl in clusters.items()
    }
    host = {c.label for cs in rows.values() for c in cs if c.host_bound}
    return {n: [c for c in cs if c.label in host] for n, cs in rows.items()}


def cell(name: str, rows: list[Comparison]) -> str:
    errors = [abs(c.error) for c in rows]
    within = sum(e <= 0.2 for e in errors)
    return f"{name} {statistics.median(errors):6.1%} {max(errors):6.1%} {within:2d}/{len(rows)}"


def main() -> None:
    totals: dict[str, list[Comparison]] = {"probe": [], "fixed": []}
    for run in RUNS:
        cluster = Cluster.load(str(RESULTS / run / "cluster.json"))
        variants = {"probe": cluster, "fixed": replace(cluster, ddp_param_host=FIXED)}
        rows = ddp_rows(RESULTS / run, variants)
        if not rows["probe"]:
            continue
        for name, cs in rows.items():
            totals[name] += cs
        reading = f"{cluster.ddp_param_host * 1e6:5.1f} us"
        print(
            f"{run:20s} probe read {reading} | " + " | ".join(cell(n, cs) for n, cs in rows.items())
        )
    for name, cs in totals.items():
        print(f"all runs: {cell(name, cs)}")
    probe, fixed = totals["probe"], totals["fixed"]

    def within(cs: list[Comparison]) -> int:
        return sum(abs(c.error) <= 0.2 for c in cs)

    def worst(cs: list[Comparison]) -> float:
        return max(abs(c.error) for c in cs)

    passes = within(fixed) > within(probe) and worst(fixed) <= worst(probe)
    print(f"rule: the fixed {FIXED * 1e6:.0f} us replaces the probe's reading: {passes}")


if __name__ == "__main__":
    main()
