"""Factories that tests import through --model tests.user_models:NAME."""

from __future__ import annotations

from torch import nn

from pipecast.data.spec import DatasetSpec


def tiny_mlp(spec: DatasetSpec) -> nn.Sequential:
    features = 1
    for d in spec.sample_shape:
        features *= d
    return nn.Sequential(
        nn.Flatten(), nn.Linear(features, 16), nn.ReLU(), nn.Linear(16, spec.num_classes)
    )


def tiny_list() -> list[nn.Module]:
    return [nn.Flatten(), nn.Linear(784, 10)]


def not_a_model() -> int:
    return 3
