"""Checkpoints on GPUs (`pipecast.runtime.checkpoint`): does a run that is killed part way
and then resumed end with the weights of a run that never stopped, and what does writing a
checkpoint cost?

Each workload runs over 2 GPUs in bf16 with Adam under 1F1B at M=8, for 6 steps (1 warm-up):

1. Twice without a stop, checkpointing after the last step. How far these two runs differ
   is the GPUs' own nondeterminism.
2. Killed: rank 1 dies at the start of step 3 (`PIPECAST_FAULT`), with a checkpoint after
   every step. The run then resumes from the checkpoint of step 3 on the same layout.
3. Moved: the same step-3 checkpoint resumed under ZB-H1 with other boundaries.

For each, the script reports how far its final state (every parameter and buffer) is from
the first uninterrupted run's: |a - b| / |a| over all tensors together, and the worst single
tensor. It also reports each checkpoint's size and the seconds each rank took to write it.

    OUT=/tmp/ckpt python3 benchmarks/checkpoint_resume.py [--dry-run]   (dry: CPU, tiny models)
        [--only NAME] [--dtype fp32]   (one workload; another dtype than bf16)

Checkpoints go to $CKPT_DIR (default /tmp/pipecast-ckpt); only the summary goes to $OUT.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path
from typing import Any

import common  # noqa: F401  (puts src/ on the path)
import torch
from common import dump, log, pack

from pipecast.api import make_job
from pipecast.models.workload import Workload
from pipecast.runtime import checkpoint
from pipecast.runtime.checkpoint import Checkpointing
from pipecast.runtime.config import RunConfig
from pipecast.runtime.launch import RankFailed
from pipecast.runtime.run import JobResult, run_job

WORK = Path(os.environ.get("CKPT_DIR", "/tmp/pipecast-ckpt"))


def workloads(dry: bool) -> list[tuple[str, Workload, int]]:
    """(name, workload, global batch)."""
    if dry:
        tiny = Workload(
            model="transformer", dataset="embeddings", seq_len=32, width=64, layers=6, heads=4
        )
        return [("gpt-tiny", tiny, 16), ("lenet5", Workload(model="lenet5", dataset="mnist"), 16)]
    gpt = Workload(
        model="transformer", dataset="embeddings", seq_len=1024, width=1024, layers=24, heads=16
    )
    return [
        ("gpt-24x1024", gpt, 32),
        ("resnet50", Workload(model="resnet50", dataset="imagenet"), 128),
    ]


def _run(
    workload: Workload,
    batch: int,
    root: Path,
    *,
    dry: bool,
    dtype: str = "bf16",
    every: int = 0,
    resume: bool = False,
    schedule: str = "1f1b",
    split: float = 0.5,
) -> JobResult:
    blocks = len(workload.build("meta"))
    cut = max(1, min(blocks - 1, round(blocks * split)))
    job, _ = make_job(
        workload,
        gpus=2,
        schedule=schedule,
        microbatches=8,
        batch=batch,
        partition=f"0,{cut},{blocks}",
        steps=5,
        warmup_steps=1,
        device="cpu" if dry else "cuda",
        config=RunConfig(
            dtype="fp32" if dry else dtype,  # type: ignore[arg-type]
            optimizer="adam",
            lr=1e-4,
            timeout_s=45,
        ),
        exact_init=dry,
        checkpoint=Checkpointing(str(root), every=every, keep=1, resume=resume),
    )
    result = run_job(job)
    assert result is not None
    return result


def _distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(|a - b| / |a| over every floating tensor together, the worst tensor's max |a - b|
    over its max |a|)."""
    assert set(a) == set(b), set(a) ^ set(b)
    keys = [k for k in a if a[k].is_floating_point()]
    diff = torch.cat([(a[k].double() - b[k].double()).flatten() for k in keys])
    norm = torch.cat([a[k].double().flatten() for k in keys]).norm()
    worst = max(
        float((a[k].double() - b[k].double()).abs().max()) / max(float(a[k].abs().max()), 1e-12)
        for k in keys
    )
    return float(diff.norm() / norm), worst


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _writes(result: JobResult) -> dict[int, list[float]]:
    """Seconds each rank took to write each checkpoint, by the steps it holds."""
    out: dict[int, list[float]] = {}
    for r in sorted(result.reports, key=lambda r: r.global_rank):
        for done, seconds in r.checkpoints:
            out.setdefault(done, []).append(round(seconds, 3))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--only", help="this workload alone")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    args = ap.parse_args()
    dry = args.dry_run
    rows: list[dict[str, Any]] = []
    for name, workload, batch in workloads(dry):
        if args.only and name != args.only:
            continue
        shutil.rmtree(WORK, ignore_errors=True)
        began = time.perf_counter()
        row: dict[str, Any] = {
            "workload": name,
            "batch": batch,
            "dtype": "fp32" if dry else args.dtype,
        }
        first = _run(workload, batch, WORK / "first", dry=dry, dtype=args.dtype)
        want = checkpoint.model_state(WORK / "first")
        row["checkpoint_bytes"] = _size(WORK / "first")
        row["write_seconds_first"] = _writes(first)
        row["step_seconds_first"] = first.summary["step_time"]
        _run(workload, batch, WORK / "again", dry=dry, dtype=args.dtype)
        row["again"] = _distance(want, checkpoint.model_state(WORK / "again"))
        shutil.rmtree(WORK / "again")

        os.environ["PIPECAST_FAULT"] = "1:3"
        try:
            _run(workload, batch, WORK / "killed", dry=dry, dtype=args.dtype, every=1)
            row["killed"] = "the run was not killed"
        except RankFailed as exc:
            row["killed"] = str(exc).splitlines()[0][:300]
        finally:
            del os.environ["PIPECAST_FAULT"]
        saved = checkpoint.latest(WORK / "killed")
        row["killed_at"] = saved.step if saved else None
        if saved is not None:
            shutil.copytree(saved.path, WORK / "moved" / saved.path.name)
        resumed = _run(
            workload, batch, WORK / "killed", dry=dry, dtype=args.dtype, every=1, resume=True
        )
        row["resumed"] = _distance(want, checkpoint.model_state(WORK / "killed"))
        row["write_seconds_resumed"] = _writes(resumed)
        moved = _run(
            workload,
            batch,
            WORK / "moved",
            dry=dry,
            dtype=args.dtype,
            resume=True,
            schedule="zb-h1",
            split=0.4,
        )
        row["moved"] = _distance(want, checkpoint.model_state(WORK / "moved"))
        row["moved_partition"] = moved.job.partition.boundaries
        row["seconds"] = round(time.perf_counter() - began, 1)
        log(
            f"{name} ({args.dtype}): checkpoint {row['checkpoint_bytes'] / 2**30:.2f} GiB, "
            f"written in {row['write_seconds_first']} s; state against the first run "
            f"(overall, worst tensor): again {row['again'][0]:.2e} {row['again'][1]:.2e}, "
            f"killed at step {row['killed_at']} and resumed {row['resumed'][0]:.2e} "
            f"{row['resumed'][1]:.2e}, "
            f"moved to ZB-H1 {row['moved_partition']} {row['moved'][0]:.2e} "
            f"{row['moved'][1]:.2e} ({row['seconds']} s)"
        )
        rows.append(row)
        dump(f"checkpoint_resume_{args.dtype}.json", rows)
    shutil.rmtree(WORK, ignore_errors=True)
    pack()


if __name__ == "__main__":
    main()
