"""The CUDA-graph rows of `results/h100x2-graphs/` predicted, eager and graphed (CPU only).

That run took no profiles, so the predictions come from h100x4-run11's profiles (4 x H100,
the same card) and h100x2-run1's probe (a 2 x H100 machine): a check of the graphed model
across machines, not a same-machine accuracy figure.

    python3 benchmarks/graphs_predicted.py > benchmarks/results/graphs-predicted.txt
"""

from __future__ import annotations

import json
import statistics

from common import ROOT

from pipecast.hardware.cluster import Cluster
from pipecast.profile.types import Profile
from pipecast.recommend.predict import predict
from pipecast.recommend.strategy import Strategy

RESULTS = ROOT / "benchmarks" / "results"
PROFILES = {
    "vgg16/cifar10": "vgg16_cifar",
    "resnet18/imagenet": "resnet18",
    "resnet50/imagenet": "resnet50",
    "transformer/embeddings": "gpt",
}


def main() -> None:
    run = json.loads((RESULTS / "h100x2-graphs" / "cuda_graphs.json").read_text())
    cluster = Cluster.load(str(RESULTS / "h100x2-run1" / "cluster.json"))
    rows: dict[tuple[str, bool], list[dict[str, object]]] = {}
    for row in run["speed"]:
        if "error" not in row:
            rows.setdefault((row["label"].removesuffix(" graphs"), row["graphed"]), []).append(row)
    print(
        f"{'configuration':52s} {'mode':8s} {'measured':>9s} {'predicted':>9s} {'error':>7s}"
        f" {'reserved GiB (measured)':>24s} {'predicted GiB':>14s}"
    )
    for (label, graphed), found in rows.items():
        parts = label.split()
        model, batch = parts[0], int(parts[1][1:])
        schedule, stages, m = parts[3], int(parts[4][:-2]), int(parts[5].split("=")[1])
        bounds = {
            "vgg16/cifar10": "0,20,40",
            "resnet18/imagenet": "0,3,11",
            "resnet50/imagenet": "0,7,19",
            "transformer/embeddings": "0,12,24",
        }[model]
        profile = Profile.load(str(RESULTS / "h100x4-run11" / f"profile_{PROFILES[model]}.json"))
        strategy = Strategy(
            kind="pipeline",
            stages=stages,
            schedule=schedule,
            microbatches=m,
            partition=bounds,
            cuda_graphs=graphed,
        )
        pred = predict(profile, cluster, strategy, batch)
        measured = statistics.median(float(r["step_ms"]) for r in found)  # type: ignore[arg-type]
        reserved = [
            max(float(v) for v in col)
            for col in zip(*(r["reserved_gib"] for r in found), strict=False)
        ]  # type: ignore[misc]
        print(
            f"{label:52s} {'graphed' if graphed else 'eager':8s} {measured:9.2f} "
            f"{pred.step_time * 1e3:9.2f} {pred.step_time * 1e3 / measured - 1:+7.1%} "
            f"{[round(x, 2) for x in reserved]!s:>24s} "
            f"{[round(b / 2**30, 2) for b in pred.timeline.peak_memory]!s:>14s}"
        )


if __name__ == "__main__":
    main()
