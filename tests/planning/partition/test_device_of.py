"""The rank a partition prices a stage's transfers on (methods._device_of): replica 0's rank
of the stage, as the layout lists the stage's ranks."""

from __future__ import annotations

import itertools

from pipecast.planning.partition.methods import _device_of
from pipecast.values.parallel import Layout


def test_a_stages_device_is_the_first_of_its_ranks() -> None:
    """Against Layout.stage_ranks over replicas, FSDP groups, tensor and context degrees and
    every placement: the first rank it lists is the one the partition prices."""
    for replicas, tensor, context, (placement, virtual) in itertools.product(
        (1, 3, 8), (1, 2, 8), (1, 2), (("one", 1), ("loop", 2), ("v", 2))
    ):
        layout = Layout(
            replicas=replicas,
            pipeline=4,
            virtual=virtual,
            placement=placement,  # type: ignore[arg-type]
            context=context,
            tensor=tensor,
        )
        for stage in range(layout.stages):
            assert _device_of(stage, layout) == layout.stage_ranks(stage)[0], (layout, stage)
