"""A model's size read from its configuration (values.models.size): past EXACT_LAYERS,
from builds of one and two layers; it must equal what a whole build counts."""

from __future__ import annotations

import pytest

from pipecast.values.models.size import EXACT_LAYERS, measure, model_size
from pipecast.values.models.workload import Workload


@pytest.mark.parametrize(
    "workload",
    [
        Workload(model="gpt", dataset="tokens", layers=EXACT_LAYERS + 3, width=64, heads=4),
        Workload(model="transformer", dataset="embeddings", layers=EXACT_LAYERS + 5, width=32),
        Workload(model="lenet5", dataset="mnist", layers=EXACT_LAYERS + 1),  # takes no layers
    ],
    ids=["gpt", "transformer", "lenet5"],
)
def test_a_size_read_from_the_configuration_is_the_built_models(workload: Workload) -> None:
    assert model_size(workload) == measure(workload.build("meta"))


def test_bytes_are_the_fp32_parameters_counted_once() -> None:
    """LeNet-5 by hand: conv 1->6 (5x5), conv 6->16 (5x5), 400->120, 120->84, 84->10."""
    params = (6 * 25 + 6) + (16 * 6 * 25 + 16) + (400 * 120 + 120) + (120 * 84 + 84) + 850
    size = model_size(Workload(model="lenet5", dataset="mnist"))
    assert (size.params, size.bytes) == (params, 4 * params)
    assert size.largest_block == 4 * (400 * 120 + 120)
