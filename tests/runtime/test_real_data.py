"""Training on real samples: every rank draws the same shuffled batches, epoch after epoch,
and the pipeline ends with the weights of a single process trained on the same batches."""

from __future__ import annotations

import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.runtime.helpers import assert_close, merged, pipeline_job, run

import pipecast.api
from pipecast.cli.main import main
from pipecast.errors import ConfigError, DataError
from pipecast.values.data.arrays import ArrayData
from pipecast.values.data.loss import loss_for
from pipecast.values.data.source import DataSource
from pipecast.values.models import Workload

LENET = Workload(model="lenet5", dataset="mnist")


def _samples(n: int, seed: int = 1) -> ArrayData:
    g = torch.Generator().manual_seed(seed)
    return ArrayData(
        torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)
    )


def _reference(data: ArrayData, batch: int, steps: int, lr: float) -> dict[str, torch.Tensor]:
    """Full-batch SGD on the batches the runtime draws: epoch e shuffled with seed e."""
    torch.manual_seed(0)
    model = LENET.build()
    loss_fn = loss_for(LENET.spec)
    drawn: list[tuple[torch.Tensor, torch.Tensor]] = []
    epoch = 0
    while len(drawn) < steps:
        drawn += list(data.batches(batch, seed=epoch))
        epoch += 1
    for x, y in drawn[:steps]:
        model.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad  # type: ignore[operator]
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.slow
def test_a_pipeline_trains_on_given_samples_as_one_process_does() -> None:
    """20 samples in batches of 8: two batches an epoch (the last 4 samples wait for the
    next shuffle), so 5 steps cross two epoch boundaries."""
    data = _samples(20)
    job = pipeline_job(LENET, "1f1b", 2, 4, [0, 6, 12], batch=8, steps=5)
    job = replace(job, data=DataSource("mnist", arrays=data))
    assert_close(merged(run(job), "params"), _reference(data, 8, 5, lr=0.1))


def test_samples_that_do_not_fit_the_model_are_one_line_errors(tmp_path: Path) -> None:
    def make(**kw: object) -> None:
        pipecast.api.make_job(LENET, gpus=2, microbatches=2, batch=8, partition="0,6,12", **kw)  # type: ignore[arg-type]

    with pytest.raises(
        ConfigError, match=r"the samples are \(3, 32, 32\), the model takes \(1, 28, 28\)"
    ):
        make(data=(torch.zeros(10, 3, 32, 32), torch.zeros(10, dtype=torch.int64)))
    with pytest.raises(ConfigError, match="targets run to 12, the model has 10 classes"):
        make(data=(torch.zeros(10, 1, 28, 28), torch.full((10,), 12)))
    with pytest.raises(ConfigError, match="class ids must be integers"):
        make(data=(torch.zeros(10, 1, 28, 28), torch.zeros(10)))
    with pytest.raises(ConfigError, match=r"batch 8 is larger than the data set \(5 samples\)"):
        make(data=(torch.zeros(5, 1, 28, 28), torch.zeros(5, dtype=torch.int64)))
    with pytest.raises(ConfigError, match="data must be"):
        make(data="samples.npy")
    with pytest.raises(ConfigError, match="not both"):
        make(data=_samples(10), data_dir=str(tmp_path))
    with pytest.raises(DataError, match="data directory not found"):
        make(data_dir=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="--data-dir reads mnist or cifar10 files"):
        pipecast.api.make_job(
            Workload(model="lenet5", dataset="digits"),
            gpus=2,
            microbatches=2,
            batch=8,
            partition="0,6,12",
            data_dir=str(tmp_path),
        )
    # a map-style dataset of (input, target) pairs is stacked into arrays
    pairs = [(torch.zeros(1, 28, 28), torch.tensor(i % 10)) for i in range(12)]
    job, _ = pipecast.api.make_job(
        LENET, gpus=2, microbatches=2, batch=8, partition="0,6,12", data=pairs
    )
    assert job.data is not None and job.data.arrays is not None
    assert job.data.arrays.inputs.shape == (12, 1, 28, 28)
    assert job.data.arrays.targets.tolist() == [i % 10 for i in range(12)]


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(
        f">{array.ndim}I", *array.shape
    )
    path.write_bytes(header + array.astype(np.uint8).tobytes())


@pytest.mark.slow
def test_train_reads_mnist_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    _write_idx(tmp_path / "train-images-idx3-ubyte", rng.integers(0, 256, (48, 28, 28)))
    _write_idx(tmp_path / "train-labels-idx1-ubyte", rng.integers(0, 10, (48,)))
    args = ["train", "--model", "lenet5", "--dataset", "mnist", "--gpus", "2", "--micro-batches"]
    args += ["2", "--batch", "16", "--partition", "0,6,12", "--steps", "4", "--warmup-steps", "0"]
    assert main([*args, "--data-dir", str(tmp_path), "--out-dir", str(tmp_path / "out")]) == 0
    assert "median step" in capsys.readouterr().out
    (tmp_path / "train-labels-idx1-ubyte").unlink()
    assert main([*args, "--data-dir", str(tmp_path), "--out-dir", str(tmp_path / "out")]) == 2
    assert "no 'train-labels-idx1-ubyte'" in capsys.readouterr().err
