"""Under torchrun each process joins the existing group (launch.run_distributed) instead of
spawning its own ranks: the same command trains to the weights of a local run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.runtime.helpers import pipeline_job

from pipecast.cli.main import main
from pipecast.runtime import checkpoint
from pipecast.runtime.job import TrainJob
from pipecast.runtime.launch import Context, spawn
from pipecast.runtime.run import agreed
from pipecast.values.models import Workload

LENET = Workload(model="lenet5", dataset="mnist")
TRAIN = [
    "train", "--model", "lenet5", "--dataset", "digits", "--gpus", "2", "--micro-batches",
    "4", "--batch", "32", "--partition", "0,6,12", "--optimizer", "momentum",
    "--warmup-steps", "0", "--steps", "2", "--device", "cpu",
]  # fmt: skip


@pytest.mark.slow
def test_torchrun_trains_to_the_weights_of_a_local_run(tmp_path: Path) -> None:
    local, launched = tmp_path / "local", tmp_path / "torchrun"
    assert main([*TRAIN, "--out-dir", str(tmp_path), "--checkpoint-dir", str(local)]) == 0
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", "-m", "pipecast", *TRAIN]
    command += ["--out-dir", str(tmp_path / "out"), "--checkpoint-dir", str(launched)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("1f1b on 2 cpu ranks") == 1  # rank 0 speaks for both
    assert (tmp_path / "out" / "lenet5-1f1b-2.measured.trace.json").exists()
    want, got = checkpoint.model_state(local), checkpoint.model_state(launched)
    assert set(want) == set(got)
    for name, tensor in want.items():
        assert torch.allclose(got[name], tensor, rtol=1e-6, atol=1e-7), name


def _agree(ctx: Context, jobs: list[TrainJob]) -> list[int]:
    return list(agreed(ctx, jobs[ctx.rank]).partition.boundaries)


def test_every_rank_runs_rank_0s_partition() -> None:
    """Automatic partitions rest on each rank's own quick profile, which can differ."""
    mine = pipeline_job(LENET, "1f1b", 2, 4, [0, 6, 12])
    other = pipeline_job(LENET, "1f1b", 2, 4, [0, 5, 12])
    assert spawn(_agree, 2, ([mine, other],)) == [[0, 6, 12], [0, 6, 12]]
