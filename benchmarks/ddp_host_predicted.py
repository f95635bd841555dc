"""Set ddp_host.py's readings beside what pipecast predicts for each of its four variants,
from the profiles and probe of a suite run on the same machine (CPU only, seconds).

    cd benchmarks && python3 ddp_host_predicted.py results/ddp-host-run1 results/h100x4-run15 \
        > results/ddp-host-run1/predicted.txt

* `one`: one GPU at the rank's share (32 samples), torch's own step (not pipecast's runtime);
* `all`: the same with the host as slow as the probe read it with all four ranks busy;
* `ddp`: torch DDP over four GPUs, buffers broadcast before every forward;
* `ddp_nobuf`: the same with no buffers to broadcast (the probe's per-buffer cost at 0).

Each cell: predicted / measured ms (the median of ddp_host's rounds) and the error.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import common  # noqa: F401  (puts src/ on the path)
from combine import run_profiles

from pipecast.hardware.cluster import Cluster
from pipecast.profile.types import Profile
from pipecast.recommend.predict import predict
from pipecast.recommend.strategy import Strategy

VARIANTS = ("one", "all", "ddp", "ddp_nobuf")


def predicted(profile: Profile, cluster: Cluster, world: int, batch: int) -> dict[str, float]:
    """Each variant's predicted step seconds for a global `batch` over `world` ranks."""
    share = batch // world
    # a single-GPU prediction takes the host factor of one busy rank; `all` is that step
    # with the host as slow as `world` busy ranks made it
    busy = dict(cluster.host_issue)
    if world in busy:
        busy[1] = busy[world]
    crowded = replace(cluster, host_issue=busy, host_contention={})
    data = Strategy(kind="data", replicas=world)
    return {
        "one": predict(
            profile, cluster, Strategy(kind="single"), share, memory_margin=0.0, runtime=False
        ).step_time,
        "all": predict(
            profile, crowded, Strategy(kind="single"), share, memory_margin=0.0, runtime=False
        ).step_time,
        "ddp": predict(
            profile, cluster, data, batch, memory_margin=0.0, ddp_buckets=True, runtime=False
        ).step_time,
        "ddp_nobuf": predict(
            profile,
            replace(cluster, ddp_buffer_host=0.0),
            data,
            batch,
            memory_margin=0.0,
            ddp_buckets=True,
            runtime=False,
        ).step_time,
    }


def main() -> None:
    readings_dir, run = Path(sys.argv[1]), Path(sys.argv[2])
    readings = json.loads((readings_dir / "ddp_host.json").read_text())
    profiles = {
        key.split("-")[0]: p for key, p in run_profiles(run).items() if key.endswith("imagenet")
    }
    cluster = Cluster.load(str(run / "cluster.json"))
    rounds = readings["rounds"]
    world = len(rounds[0])
    print(
        f"ddp_host on {world} x {readings['device']} ({len(rounds)} rounds), predicted from "
        f"{run.name}'s profiles and probe; each cell predicted/measured ms and the error"
    )
    print(f"{'model':12s} " + " ".join(f"{v:>22s}" for v in VARIANTS) + "   DDP's own (ddp - all)")
    for model in rounds[0][0]:
        measured = {v: statistics.median(r[0][model][v][0] for r in rounds) for v in VARIANTS}
        pred = predicted(profiles[model], cluster, world, 128)
        cells = [
            f"{pred[v] * 1e3:6.1f}/{measured[v] * 1e3:6.1f} {pred[v] / measured[v] - 1:+6.1%}"
            for v in VARIANTS
        ]
        own = (pred["ddp"] - pred["all"], measured["ddp"] - measured["all"])
        print(
            f"{model:12s} "
            + " ".join(f"{c:>22s}" for c in cells)
            + f"   {own[0] * 1e3:5.1f}/{own[1] * 1e3:5.1f}"
        )
    alone = {m: statistics.median(r[0][m]["one"][1] for r in rounds) * 1e3 for m in rounds[0][0]}
    print(
        "rank 0 alone issued its step in (median of rounds, ms): "
        + ", ".join(f"{m} {t:.1f}" for m, t in alone.items())
    )


if __name__ == "__main__":
    main()
