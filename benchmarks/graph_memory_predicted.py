"""Graphed peak memory predicted against measured in fresh processes, out of sample.

`graph_memory.py --match graphs` measured five graphed configurations on 2 x H100, each in a
fresh process, and profiles of their models were taken on the same machine right after
(`results/h100x2-graph-memory-2/`: ResNet-18 and MobileNetV2 at micro-batch 32,
VGG-16/CIFAR-10 at 4, 32 and 128, bf16, with graph times and each block's library
workspaces). This predicts each configuration's peak per rank from those profiles, with the
probe of h100x2-graphs-run2 (the same machine type; memory hardly depends on it), and prints
both (CPU only; output: results/graph-memory-predicted.txt).

    cd benchmarks && python3 graph_memory_predicted.py > results/graph-memory-predicted.txt
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import common  # noqa: F401  (puts src/ on the path)
from combine import run_profiles

from pipecast.bench.config import BenchConfig
from pipecast.bench.predictions import predictions
from pipecast.bench.store import Store
from pipecast.hardware.cluster import Cluster

RESULTS = Path(__file__).resolve().parent / "results"
RUN = RESULTS / "h100x2-graph-memory-2"
STORED = RESULTS / "h100x2-graphs-run2"


def main() -> None:
    measured = {
        row["label"]: [
            max(p["peak_allocated"] for p in r["peaks"][1:])  # after the capturing step
            for r in sorted(row["ranks"], key=lambda r: r["rank"])
        ]
        for row in json.loads((RUN / "graph_memory.json").read_text())
        if "ranks" in row
    }
    profiles = run_profiles(RUN)
    configs = {
        c.label(): c
        for c in (BenchConfig.from_dict(r.config) for r in Store(STORED / "bench.sqlite").rows())
    }
    wanted = [configs[label] for label in measured if label in configs]
    predicted = predictions(wanted, profiles, Cluster.load(str(STORED / "cluster.json")))
    errors = []
    print("GiB per rank, measured in a fresh process / predicted (error)")
    for cfg in wanted:
        got, want = measured[cfg.label()], predicted[cfg.key]["peak_memory"]
        cells = []
        for m, p in zip(got, want, strict=True):
            errors.append(abs(p - m) / m)
            cells.append(f"{m / 2**30:.3f} / {p / 2**30:.3f} ({(p - m) / m:+.1%})")
        print(f"{cfg.label()}: " + ", ".join(cells))
    print(
        f"{len(errors)} ranks: median |error| {statistics.median(errors):.1%}, "
        f"worst {max(errors):.1%}"
    )


if __name__ == "__main__":
    main()
