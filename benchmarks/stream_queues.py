"""Do the ranks' compute and NCCL streams share the GPU's hardware queues? The steady misses
of h100x4-run7 slow down part way through a step: on VGG-16/CIFAR-10 GPipe over 4 GPUs at
M=32 the last rank's backwards take 110 us each for twelve micro-batches, then 800-1,100 us;
on ResNet-18 1F1B the last two ranks' forwards after their first backward take 2-3x the
first. CUDA maps streams onto CUDA_DEVICE_MAX_CONNECTIONS hardware queues (8 unless set),
and a send that waits for its peer can then hold back compute queued behind it.

Each configuration of run 7's store that this names runs in a fresh world per setting of
CUDA_DEVICE_MAX_CONNECTIONS (unset, 32, 1), the settings interleaved round by round, so the
host's spells fall on all of them alike. Nothing is predicted: the rows keep their step
times, per-rank host times and action timelines (`stream_queues.json`, and a store per
setting).

    cd benchmarks && OUT=/tmp/q python3 stream_queues.py       (--dry-run: tiny, on CPU ranks)
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from common import OUT, ROOT, dry_pipelines, dump, log, stored_configs

from pipecast.bench.config import BenchConfig
from pipecast.bench.runner import run_suite
from pipecast.bench.store import Store

RUN = ROOT / "benchmarks" / "results" / "h100x4-run7" / "bench.sqlite"
SETTINGS = ("unset", "32", "1")
WANTED = (
    ("resnet18", "imagenet", "1f1b", 4),
    ("vgg16", "cifar10", "gpipe", 16),
    ("vgg16", "cifar10", "gpipe", 32),
    ("vgg16", "imagenet", "1f1b", 8),
    ("transformer", "embeddings", "zb-h1", 16),
)


def chosen() -> list[BenchConfig]:
    """Run 7's 4-GPU pipecast rows of WANTED (the first of each)."""
    return stored_configs(RUN, WANTED, "queues")


def dry_configs() -> list[BenchConfig]:
    return dry_pipelines("queues", ("gpipe", "1f1b"))


def digest(row: Any) -> dict[str, Any]:
    m = row.measured or {}
    a = m.get("actions", {})
    per_action = {
        kind: [
            h / n if n else 0.0
            for h, n in zip(a.get(f"host_{kind}", []), a.get(f"count_{kind}", []), strict=False)
        ]
        for kind in ("F", "B", "W", "BW")
    }
    return {
        "label": BenchConfig.from_dict(row.config).label(),
        "status": row.status,
        "step_time": m.get("step_time"),
        "rounds": m.get("rounds"),
        "host_per_action": per_action,
        "loop": a.get("loop"),
        "after_loop": a.get("after_loop"),
        "timeline": m.get("timeline"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    configs = dry_configs() if args.dry_run else chosen()
    log(f"{len(configs)} configurations: " + "; ".join(c.label() for c in configs))
    before = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
    stores = {s: Path(OUT) / f"queues_{s}.sqlite" for s in SETTINGS}
    for r in range(1, args.rounds + 1):
        for setting in SETTINGS:
            if setting == "unset":
                os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
            else:
                os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = setting
            run_suite(configs, str(stores[setting]), timeout_s=180, rounds=r)
            log(f"round {r}, CUDA_DEVICE_MAX_CONNECTIONS={setting}: done")
    if before is None:
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    else:
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = before
    result: dict[str, dict[str, Any]] = {}
    for setting, path in stores.items():
        result[setting] = {row.key: digest(row) for row in Store(str(path)).rows()}
    dump("stream_queues.json", result)
    for c in configs:
        cells = []
        for setting in SETTINGS:
            row = result[setting].get(c.key, {})
            t = row.get("step_time")
            spread = row.get("rounds") or []
            cells.append(f"{setting}: {t * 1e3:.2f} ms" if t else f"{setting}: -")
            if spread:
                cells[-1] += f" (rounds {', '.join(f'{x * 1e3:.1f}' for x in spread)})"
        log(f"{c.label()}: " + " | ".join(cells))
    log("done")


if __name__ == "__main__":
    main()
