from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pipecast.errors import DataError, UnknownNameError
from pipecast.values.data import (
    get_spec,
    load_cifar10,
    load_digits_as_mnist,
    load_mnist,
    synthetic_batch,
)


def _write_idx(path: Path, array: np.ndarray, *, gz: bool = False) -> None:
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(
        f">{array.ndim}I", *array.shape
    )
    raw = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if gz else raw)


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_idx_roundtrip(tmp_path: Path, gz: bool) -> None:
    images = np.random.default_rng(0).integers(0, 256, (5, 28, 28))
    labels = np.array([3, 1, 4, 1, 5])
    suffix = ".gz" if gz else ""
    _write_idx(tmp_path / f"train-images-idx3-ubyte{suffix}", images, gz=gz)
    _write_idx(tmp_path / f"train-labels-idx1-ubyte{suffix}", labels, gz=gz)
    data = load_mnist(tmp_path)
    assert data.inputs.shape == (5, 1, 28, 28)
    assert data.targets.tolist() == [3, 1, 4, 1, 5]
    expected = (torch.tensor(images[2], dtype=torch.float32) / 255 - 0.1307) / 0.3081
    assert torch.allclose(data.inputs[2, 0], expected)


def test_mnist_malformed_and_missing(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        load_mnist(tmp_path / "nope")
    with pytest.raises(DataError, match="no 'train-images-idx3-ubyte'"):
        load_mnist(tmp_path)
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"\x12\x34\x56\x78rest")
    with pytest.raises(DataError, match="no 'train-labels-idx1-ubyte'"):  # found before reading
        load_mnist(tmp_path)
    _write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(2))
    with pytest.raises(DataError, match="bad magic"):
        load_mnist(tmp_path)
    _write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((2, 28, 28)))
    raw = (tmp_path / "train-images-idx3-ubyte").read_bytes()
    (tmp_path / "train-images-idx3-ubyte").write_bytes(raw[:-10])
    with pytest.raises(DataError, match="malformed"):
        load_mnist(tmp_path)


def test_cifar_batches(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    for name in ("data_batch_1", "data_batch_2", "test_batch"):
        batch = {b"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8), b"labels": [0, 1, 2, 9]}
        (tmp_path / name).write_bytes(pickle.dumps(batch))
    train = load_cifar10(tmp_path)
    assert train.inputs.shape == (8, 3, 32, 32) and train.targets.tolist() == [0, 1, 2, 9] * 2
    assert len(load_cifar10(tmp_path, train=False)) == 4
    (tmp_path / "data_batch_1").write_bytes(b"garbage")
    with pytest.raises(DataError, match="not a CIFAR-10 python batch"):
        load_cifar10(tmp_path)


def test_synthetic_is_seeded_and_shaped() -> None:
    spec = get_spec("imagenet")
    x1, y1 = synthetic_batch(spec, 3, seed=7)
    x2, y2 = synthetic_batch(spec, 3, seed=7)
    x3, _ = synthetic_batch(spec, 3, seed=8)
    assert x1.shape == (3, 3, 224, 224) and y1.shape == (3,) and int(y1.max()) < 1000
    assert torch.equal(x1, x2) and torch.equal(y1, y2) and not torch.equal(x1, x3)
    tokens, nxt = synthetic_batch(get_spec("tokens", seq_len=12, vocab=30), 2)
    assert tokens.dtype == torch.int64 and tokens.shape == (2, 12) and nxt.shape == (2, 12)
    emb, target = synthetic_batch(get_spec("embeddings", seq_len=4, width=8), 2)
    assert emb.shape == target.shape == (2, 4, 8)


def test_unknown_dataset_lists_valid_names() -> None:
    with pytest.raises(UnknownNameError, match="cifar10, digits, embeddings"):
        get_spec("cifar100")


def test_digits_train_to_90_percent() -> None:
    data = load_digits_as_mnist()
    assert data.inputs.shape == (1797, 1, 28, 28)
    train, test = data.split(0.8, seed=0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for epoch in range(8):
        for x, y in train.batches(64, seed=epoch):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    with torch.no_grad():
        accuracy = (model(test.inputs).argmax(1) == test.targets).float().mean().item()
    assert accuracy > 0.9
