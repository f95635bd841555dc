"""Data sets: synthetic ones with real shapes, the real digits set, and on-disk loaders."""

from pipecast.values.data.arrays import ArrayData
from pipecast.values.data.digits import load_digits_as_mnist
from pipecast.values.data.files import load_cifar10, load_mnist
from pipecast.values.data.loss import loss_for
from pipecast.values.data.registry import dataset_names, get_spec
from pipecast.values.data.spec import DatasetSpec
from pipecast.values.data.synthetic import synthetic_batch

__all__ = [
    "ArrayData",
    "DatasetSpec",
    "dataset_names",
    "get_spec",
    "load_cifar10",
    "load_digits_as_mnist",
    "load_mnist",
    "loss_for",
    "synthetic_batch",
]
