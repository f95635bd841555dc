"""Slow CPUs or a slow host? h100x4-run22's pure-Python loop readings fell in two groups about
2x apart (about 7-9 and 13-16 ms), in gpu_run.py's own process and in new interpreters
alike, and the host-bound rows miss with the host's spells. If the slow readings belong to
some of the machine's CPUs, pinning the profiler and each rank to fast CPUs is the fix; if
every CPU slows at the same moments, the host itself changes speed.

First the loop once on each CPU this process may use, pinned there, `--passes` times round
them all. Then, on the `--picks` fastest and slowest CPUs by that reading, interleaved and
`--rounds` times over, with every thread of this process pinned to the one CPU: the loop, the
tiny model's issue time (hostspeed.issue) and the host time to issue a whole forward and
backward of VGG-16/CIFAR-10 at 4 samples, the model whose host-bound rows missed on runs 21
and 22. A fast CPU that reads fast in every pass and issues the model faster says pin; equal
issue times say the loop's groups are the host's spells. Half a minute on a 64-CPU machine;
OUT/core_speed.json and a log line per measure.

    OUT=/tmp/o python3 benchmarks/core_speed.py [--passes 3 --picks 3 --rounds 3]
    python3 benchmarks/core_speed.py --dry-run       # on the CPU, the model's compute included
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from typing import Any

import torch
from common import dump, log, pack
from machine_state import core_loops, core_summary, smt_siblings

from pipecast.hardware import devices, hostspeed
from pipecast.models.workload import Workload

MEASURES = ("loop", "issue", "vgg16_cifar_b4")


def pin_process(cpus: set[int]) -> None:
    """Every thread of this process onto `cpus` (a thread that ended meanwhile is skipped):
    on a GPU the backward runs on autograd's own thread for the device, not the caller's."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), cpus)


def picks(readings: dict[str, list[float]], n: int) -> tuple[list[int], list[int]]:
    """The `n` fastest and `n` slowest CPUs by their median reading (apart where fewer
    than 2n CPUs are allowed)."""
    order = sorted(readings, key=lambda c: statistics.median(readings[c]))
    n = max(1, min(n, len(order) // 2))
    return [int(c) for c in order[:n]], [int(c) for c in order[-n:]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--picks", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    device = torch.device("cpu" if args.dry_run or not torch.cuda.is_available() else "cuda")
    if device.type == "cpu":
        torch.set_num_threads(1)  # one CPU each: intra-op threads would only contend
    allowed = os.sched_getaffinity(0)
    began = time.time()
    readings = core_loops(passes=args.passes)
    log(f"loop pinned to each CPU, {args.passes} passes: {core_summary(readings)}")
    fast, slow = picks(readings, args.picks)
    log(f"fastest CPUs {fast}, slowest {slow}")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    model = Workload(model="vgg16", dataset="cifar10").build().to(device, dtype)
    x = torch.randn(4, 3, 32, 32, device=device, dtype=dtype)
    rows: list[dict[str, Any]] = []
    try:
        hostspeed.issue(device)  # first calls build the tiny model and warm the kernels
        hostspeed.step_seconds(model, x, device, repeats=1, warmup=1, zero_grad=True)
        order = [
            (c, g) for f, s in zip(fast, slow, strict=True) for c, g in ((f, "fast"), (s, "slow"))
        ]
        for r in range(args.rounds):
            for cpu, group in order:
                pin_process({cpu})
                rows.append(
                    {
                        "round": r,
                        "cpu": cpu,
                        "group": group,
                        "time": time.time(),
                        "loop": hostspeed.reference(repeats=3),
                        "issue": hostspeed.issue(device, repeats=5),
                        "vgg16_cifar_b4": hostspeed.step_seconds(
                            model, x, device, repeats=5, warmup=1, zero_grad=True
                        ),
                    }
                )
    finally:
        pin_process(allowed)
        dump(
            "core_speed.json",
            {
                "device": devices.name(device),
                "cpus": len(allowed),
                "smt_siblings": smt_siblings(),
                "passes": readings,
                "fast": fast,
                "slow": slow,
                "rows": rows,
            },
        )
        pack()
    for measure in MEASURES:
        by = {
            g: statistics.median(row[measure] for row in rows if row["group"] == g) * 1e3
            for g in ("fast", "slow")
        }
        log(
            f"{measure}, ms, median on the fastest CPUs {by['fast']:.2f}, on the slowest "
            f"{by['slow']:.2f} ({by['slow'] / by['fast']:.2f}x)"
        )
    log(f"done in {time.time() - began:.1f} s")


if __name__ == "__main__":
    main()
