"""What 8 GPUs would do for ANCHORS.md's GPT workload, predicted from the profile and links
measured on 4 x H200 (the 8-GPU machines are not lent; nothing here was run on 8 GPUs).

An 8-GPU node is modelled as the probed 4-GPU node's links and all-reduce bandwidth, with 8 GPUs.

    python3 benchmarks/simulate_8gpu.py benchmarks/results/h200x4-run4
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from pipecast.hardware.cluster import Cluster  # noqa: E402
from pipecast.profile.types import Profile  # noqa: E402
from pipecast.recommend.predict import predict  # noqa: E402
from pipecast.recommend.rank import recommend  # noqa: E402
from pipecast.recommend.strategy import Strategy  # noqa: E402


def main(results: str) -> None:
    run = Path(results)
    profile = Profile.load(str(run / "profile_gpt.json"))
    four = Cluster.load(str(run / "cluster.json"))
    eight = replace(four, name="8 x H200 (modelled)", gpus_per_node=8, pairs={})
    out: dict[str, object] = {
        "source": str(run),
        "device": profile.device,
        "note": "simulated; not run on 8 GPUs",
    }
    rows = []
    batch = 64
    for label, strategy in (
        *[
            (
                f"8 stages {s} M={m}",
                Strategy(
                    kind="pipeline",
                    stages=8,
                    schedule=s,
                    microbatches=m,
                    partition=",".join(map(str, range(0, 25, 3))),
                ),
            )
            for s in ("1f1b", "zb-h1", "gpipe")
            for m in (8, 16, 32, 64)
        ],
        *[
            (
                f"2 x 4 stages {s} M={m}",
                Strategy(
                    kind="hybrid",
                    stages=4,
                    replicas=2,
                    schedule=s,
                    microbatches=m,
                    partition="0,6,12,18,24",
                ),
            )
            for s in ("1f1b", "zb-h1")
            for m in (4, 8, 16, 32)
        ],
        ("DDP x8", Strategy(kind="data", replicas=8)),
        (
            "4 stages 1f1b M=8 (the 4-GPU half)",
            Strategy(
                kind="pipeline", stages=4, schedule="1f1b", microbatches=8, partition="0,6,12,18,24"
            ),
        ),
    ):
        pred = predict(profile, eight, strategy, batch, memory_margin=0.0)
        rows.append(
            {
                "strategy": label,
                "batch": batch,
                "step_s": pred.step_time,
                "samples_per_second": pred.samples_per_second,
                "bubble": pred.timeline.bubble_fraction,
                "peak_memory_gib": pred.peak_memory / 2**30,
            }
        )
    out["strategies"] = rows
    rec = recommend(profile, eight, batch, gpus=8)
    out["recommendation"] = {"strategy": rec.best.strategy.label(), "reason": rec.reason()}
    # the GPipe paper's scaling table: speed-up over one partition, K = 2, 4, 8 and M = 1, 4, 32
    scaling = {}
    for m in (1, 4, 32):
        base = predict(profile, eight, Strategy(kind="single", microbatches=m), 32).step_time
        for k in (2, 4, 8):
            bounds = ",".join(str(24 * i // k) for i in range(k + 1))
            t = predict(
                profile,
                eight,
                Strategy(
                    kind="pipeline", stages=k, schedule="gpipe", microbatches=m, partition=bounds
                ),
                32,
            ).step_time
            scaling[f"K={k} M={m}"] = base / t
    out["gpipe_scaling_speedup"] = scaling
    target = ROOT / "benchmarks" / "results" / "8gpu-simulated.json"
    target.write_text(json.dumps(out, indent=1))
    for r in rows:
        print(
            f"{r['strategy']:38s} {r['samples_per_second']:7.1f} samples/s  bubble "
            f"{r['bubble']:.0%}  {r['peak_memory_gib']:.1f} GiB"
        )
    print("recommendation:", out["recommendation"])
    print(
        "GPipe scaling (speed-up over 1 partition, same M):",
        {k: round(v, 2) for k, v in scaling.items()},
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/h200x4-run4")
