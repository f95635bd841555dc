"""Does Python's garbage collector run during the runtime's steps? The profiler times with
collection off (profile.measure.quiet_gc), the runtime runs with it on, so a collection in a
step would be host time no profile holds. Every rank counts its collections by generation
(gc.callbacks, installed through a sitecustomize the ranks import) over a run of `--steps`
and of `--steps` + 100; the difference is what 100 steps collected (CPU or GPU):

    cd benchmarks && python3 gc_during_steps.py [--device cuda] > results/gc-during-steps.txt
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HOOK = """
import atexit, gc, json, os
_counts = [0, 0, 0]
def _count(phase, info):
    if phase == "stop":
        _counts[info["generation"]] += 1
gc.callbacks.append(_count)
def _dump():
    with open(os.path.join(os.environ["GC_COUNTS"], f"{os.getpid()}.json"), "w") as fh:
        json.dump({"counts": _counts}, fh)
atexit.register(_dump)
"""


def counts(steps: int, args: argparse.Namespace, hook: Path) -> list[dict[str, list[int]]]:
    """Per process of one `pipecast train` run, in the order they started (the launcher
    first, then its helpers and the ranks), its collections."""
    out = Path(tempfile.mkdtemp())
    env = dict(
        os.environ,
        GC_COUNTS=str(out),
        PYTHONPATH=f"{hook}{os.pathsep}" + os.environ.get("PYTHONPATH", ""),
    )
    cmd = [
        sys.executable,
        "-m",
        "pipecast.cli.main",
        "train",
        "--model",
        "gpt",
        "--dataset",
        "tokens",
        "--layers",
        "4",
        "--width",
        "64",
        "--seq-len",
        "32",
        "--gpus",
        str(args.gpus),
        "--schedule",
        args.schedule,
        "--micro-batches",
        "16",
        "--batch",
        "32",
        "--steps",
        str(steps),
        "--warmup-steps",
        "2",
        "--device",
        args.device,
        "--out-dir",
        str(out / "trace"),
    ]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return [
        json.loads(p.read_text()) for p in sorted(out.glob("*.json"), key=lambda p: int(p.stem))
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--schedule", default="zb-h1")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    hook = Path(tempfile.mkdtemp())
    (hook / "sitecustomize.py").write_text(HOOK)
    short, long = counts(args.steps, args, hook), counts(args.steps + 100, args, hook)
    print(
        f"a small GPT (4 layers, width 64), {args.schedule} over {args.gpus} "
        f"{args.device} ranks, M=16"
    )
    for i, (a, b) in enumerate(zip(short, long, strict=True)):
        extra = [y - x for x, y in zip(a["counts"], b["counts"], strict=True)]
        print(
            f"process {i}: collections by generation {a['counts']} in {args.steps} steps, "
            f"{b['counts']} in {args.steps + 100}; 100 more steps: {extra}"
        )


if __name__ == "__main__":
    main()
