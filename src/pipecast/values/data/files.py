"""Readers for MNIST IDX files and CIFAR-10 python batches a user already has on disk."""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import torch

from pipecast.errors import DataError
from pipecast.values.data.arrays import ArrayData

_IDX_DTYPES: dict[int, str | type[np.generic]] = {
    0x08: np.uint8,
    0x09: np.int8,
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (MNIST's format, optionally gzipped) as an array of its stored shape."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"MNIST file not found: {path}") from None
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except OSError as exc:
            raise DataError(f"{path} is not a valid gzip file ({exc})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DataError(f"{path} is not an IDX file: bad magic number {raw[:4].hex()}")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path} is truncated: header needs {header} bytes, file has {len(raw)}")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataError(
            f"{path} is malformed: shape {dims} needs {expected} data bytes, "
            f"file has {len(raw) - header}"
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)


def _find(directory: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx")):
        if (directory / name).exists():
            return directory / name
    raise DataError(f"no '{stem}' (or .gz) in {directory}: point --data-dir at the MNIST files")


def mnist_files(directory: str | Path, *, train: bool = True) -> tuple[Path, Path]:
    """The images and labels files load_mnist reads, or a DataError naming what is missing
    (cheap: run before any rank starts)."""
    root = Path(directory)
    if not root.is_dir():
        raise DataError(f"data directory not found: {root}")
    prefix = "train" if train else "t10k"
    return _find(root, f"{prefix}-images-idx3-ubyte"), _find(root, f"{prefix}-labels-idx1-ubyte")


def load_mnist(directory: str | Path, *, train: bool = True) -> ArrayData:
    """MNIST from `directory` holding train-/t10k- images-idx3-ubyte and labels-idx1-ubyte."""
    root = Path(directory)
    image_file, label_file = mnist_files(root, train=train)
    images = read_idx(image_file)
    labels = read_idx(label_file)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DataError(
            f"MNIST files in {root} disagree: images {images.shape}, labels {labels.shape}"
        )
    x = torch.tensor(images, dtype=torch.float32).unsqueeze(1) / 255.0
    x = (x - 0.1307) / 0.3081
    return ArrayData(x, torch.tensor(labels, dtype=torch.int64))


def cifar10_files(directory: str | Path, *, train: bool = True) -> list[Path]:
    """The python batches load_cifar10 reads (those present), or a DataError where there are
    none (cheap: run before any rank starts)."""
    root = Path(directory)
    if (root / "cifar-10-batches-py").is_dir():
        root = root / "cifar-10-batches-py"
    if not root.is_dir():
        raise DataError(f"data directory not found: {root}")
    names = [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]
    present = [root / n for n in names if (root / n).exists()]
    if not present:
        raise DataError(
            f"no CIFAR-10 batches ({', '.join(names)}) in {root}: point --data-dir at the "
            "CIFAR-10 python batches"
        )
    return present


def load_cifar10(directory: str | Path, *, train: bool = True) -> ArrayData:
    """CIFAR-10 from the python batches (data_batch_1..5, test_batch) in `directory`."""
    xs, ys = [], []
    for path in cifar10_files(directory, train=train):
        try:
            with path.open("rb") as fh:
                batch = pickle.load(fh, encoding="bytes")
            data = np.asarray(batch[b"data"], dtype=np.uint8)
            labels = np.asarray(batch[b"labels"], dtype=np.int64)
        except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{path} is not a CIFAR-10 python batch ({exc!r})") from None
        if data.ndim != 2 or data.shape[1] != 3072 or len(data) != len(labels):
            raise DataError(f"{path} is malformed: data {data.shape}, labels {labels.shape}")
        xs.append(data.reshape(-1, 3, 32, 32))
        ys.append(labels)
    x = torch.tensor(np.concatenate(xs), dtype=torch.float32) / 255.0
    mean = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
    std = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1)
    return ArrayData((x - mean) / std, torch.tensor(np.concatenate(ys)))
