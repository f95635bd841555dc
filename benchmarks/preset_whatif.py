"""How good are the named presets (`--cluster h100-nvlink`, and the default for a profile
taken on an H100 or H200 with no probe) at predicting what the lent machines measured?
Every stored H100/H200 run re-predicted from its own profiles three ways (CPU only;
output: results/preset-whatif.txt):

* `probe`: the run's own probe (what the stored runs are judged by);
* `preset`: the preset as it stands, sized to the run's GPUs;
* `probed-preset`: the preset with each figure the probe reads set to the median of every
  *other* run's probe on the same GPU (leave one out: the run being predicted does not
  inform its own preset): links, all-reduce, matmul rate, the runtime's host cost per action
  and per step, DDP's host costs, the host contention factor.

Each line: a variant's median and worst |error|, rows within 20%, picks right; then totals.

    cd benchmarks && python3 preset_whatif.py > results/preset-whatif.txt
"""

from __future__ import annotations

from pathlib import Path

from combine import as_probed_now, repredicted
from error_bands import RUNS

from pipecast.bench.accuracy import comparisons, summary
from pipecast.hardware.cluster import Cluster
from pipecast.hardware.presets import PRESETS, gpu_kind, measured_preset

RESULTS = Path(__file__).resolve().parent / "results"


def gpu_of(cluster: Cluster) -> str:
    return f"{gpu_kind(cluster.device) or 'h100'}-nvlink"


def main() -> None:
    clusters = {run: Cluster.load(str(RESULTS / run / "cluster.json")) for run in RUNS}
    totals: dict[str, list[int]] = {}
    for run, own in clusters.items():
        name = gpu_of(own)
        others = [c for r, c in clusters.items() if r != run and gpu_of(c) == name]
        variants = {
            "probe": as_probed_now(own),
            "preset": PRESETS[name].subset(own.world),
            "probed-preset": measured_preset(PRESETS[name], others).subset(own.world),
        }
        cells = []
        for label, cluster in variants.items():
            s = summary(comparisons(repredicted(RESULTS / run, cluster=cluster)))
            t = totals.setdefault(label, [0, 0, 0, 0])
            t[0] += s["within_20_percent"]
            t[1] += s["configurations"]
            t[2] += s["right"]
            t[3] += s["decisions"]
            cells.append(
                f"{label} {s['median_abs_error']:6.1%} {s['worst_abs_error']:6.1%} "
                f"{s['within_20_percent']:2d} {s['right']:2d}/{s['decisions']}"
            )
        print(f"{run:20s} " + " | ".join(cells), flush=True)
    for label, (within, rows, right, decisions) in totals.items():
        print(f"{label}: {within} of {rows} within 20%, picks {right} of {decisions}")


if __name__ == "__main__":
    main()
