"""Where a training run's samples come from.

Without real samples a run draws synthetic batches of its data set's shapes, seeded by the
step. With real ones, every rank reads the same samples for itself (files it finds under a
directory, the digits that ship with scikit-learn, or arrays handed to the Python API) and
draws the same shuffled batches from them, one epoch after another: the first stage takes
the inputs and the last the targets of the same samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipecast.errors import ConfigError
from pipecast.values.data.arrays import ArrayData
from pipecast.values.data.digits import load_digits_as_mnist
from pipecast.values.data.files import cifar10_files, load_cifar10, load_mnist, mnist_files
from pipecast.values.data.registry import get_spec
from pipecast.values.data.spec import DatasetSpec

FILES = ("mnist", "cifar10")
"""Data sets read from files a user already has (nothing is downloaded)."""


def load_real(dataset: str, directory: str | None, *, train: bool = True) -> ArrayData:
    """Real samples: the shipped digits set, or MNIST/CIFAR-10 files under `directory`."""
    if dataset == "digits":
        return load_digits_as_mnist()
    if dataset not in FILES:
        get_spec(dataset)  # unknown names get the list of valid ones
        raise ConfigError(
            f"'{dataset}' is synthetic only: real data exists for digits, mnist and cifar10"
        )
    if directory is None:
        raise ConfigError(f"reading {dataset} needs --data-dir (nothing is downloaded)")
    if dataset == "mnist":
        return load_mnist(directory, train=train)
    return load_cifar10(directory, train=train)


@dataclass(frozen=True)
class DataSource:
    """A run's samples: `dataset`'s synthetic shapes, or real samples from `directory`, from
    `arrays`, or (for 'digits') the shipped set's training split."""

    dataset: str
    directory: str | None = None
    """MNIST IDX files or CIFAR-10 python batches (the training split is read)."""
    arrays: ArrayData | None = None
    """Samples given in memory; every rank gets a copy."""

    @property
    def real(self) -> bool:
        return self.arrays is not None or self.directory is not None or self.dataset == "digits"

    def load(self) -> ArrayData:
        """The real samples (ConfigError for a synthetic source)."""
        if self.arrays is not None:
            return self.arrays
        if not self.real:
            raise ConfigError(f"{self.dataset} is synthetic here: no samples to load")
        if self.dataset == "digits":  # the training split; the rest is for checking accuracy
            return load_digits_as_mnist().split(0.8, seed=0)[0]
        return load_real(self.dataset, self.directory)

    def check(self, spec: DatasetSpec, batch: int) -> None:
        """What makes these samples wrong for the model, as a one-line error: given in memory,
        checked whole here; files, that the ones the readers read are there (the ranks that
        read them check their contents through `fits`)."""
        if self.arrays is not None:
            fits(self.arrays, spec, batch)
        if self.directory is not None:
            if self.dataset not in FILES:
                raise ConfigError(
                    f"--data-dir reads {' or '.join(FILES)} files; this model takes {self.dataset}"
                )
            if self.dataset == "mnist":
                mnist_files(self.directory)
            else:
                cifar10_files(self.directory)


def fits(data: ArrayData, spec: DatasetSpec, batch: int) -> None:
    """A one-line error unless `data`'s samples have the shape the model takes and one
    step's batch fits in the samples."""
    shape = tuple(data.inputs.shape[1:])
    if shape != spec.sample_shape:
        raise ConfigError(
            f"the samples are {shape}, the model takes {spec.sample_shape} ({spec.name})"
        )
    if tuple(data.targets.shape[1:]) != spec.target_shape:
        raise ConfigError(
            f"the targets are {tuple(data.targets.shape[1:])} a sample, the loss takes "
            f"{spec.target_shape} ({spec.name})"
        )
    if len(data) < batch:
        raise ConfigError(f"batch {batch} is larger than the data set ({len(data)} samples)")
    if spec.target != "regression" and data.targets.dtype.is_floating_point:
        raise ConfigError(f"the targets are {data.targets.dtype}, class ids must be integers")
    if spec.target != "regression":
        top = int(data.targets.max()) if len(data) else 0
        if top >= spec.num_classes or (len(data) and int(data.targets.min()) < 0):
            raise ConfigError(
                f"targets run to {top}, the model has {spec.num_classes} classes ({spec.name})"
            )


def as_arrays(data: object) -> ArrayData:
    """Samples handed to the Python API as ArrayData: an ArrayData, an (inputs, targets)
    pair of tensors, or a map-style dataset of (input, target) pairs (stacked)."""
    if isinstance(data, ArrayData):
        return data
    if (
        isinstance(data, tuple)
        and len(data) == 2
        and all(isinstance(t, torch.Tensor) for t in data)
    ):
        return ArrayData(data[0], data[1])
    if hasattr(data, "__len__") and hasattr(data, "__getitem__"):
        pairs = [data[i] for i in range(len(data))]
        if pairs and all(isinstance(p, tuple | list) and len(p) == 2 for p in pairs):
            inputs = torch.stack([torch.as_tensor(p[0]) for p in pairs])
            targets = torch.stack([torch.as_tensor(p[1]) for p in pairs])
            return ArrayData(inputs, targets)
    raise ConfigError(
        "data must be (inputs, targets) tensors, an ArrayData or a dataset of (input, target) "
        f"pairs, got {type(data).__name__}"
    )
