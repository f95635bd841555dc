"""Interleaved 1F1B over 3 and 4 virtual stages per rank on 2 gloo CPU ranks trains to one
process's weights (issue 67)."""

from __future__ import annotations

import functools

import pytest
import torch
from tests.runtime.helpers import assert_close, merged, pipeline_job, reference_step, run_all

from pipecast.runtime.run import JobResult
from pipecast.values.models import Workload

LENET = Workload(model="lenet5", dataset="mnist")  # 12 blocks, 5 of them with weights
CASES = {
    # 8 stages, each rank holding two of the weighted blocks (stage s on rank s % 2)
    4: (4, [0, 1, 3, 4, 6, 7, 9, 10, 12]),
    # 6 stages, micro-batches in 3 groups of the 2 ranks
    3: (6, [0, 1, 3, 4, 7, 9, 12]),
}
"""Virtual stages per rank: (micro-batches, boundaries)."""


@functools.cache
def _results() -> dict[int, JobResult]:
    jobs = {
        v: pipeline_job(LENET, "interleaved", 2, m, bounds, batch=12, steps=2, virtual=v)
        for v, (m, bounds) in CASES.items()
    }
    return dict(zip(jobs, run_all(list(jobs.values())), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("virtual", sorted(CASES))
def test_interleaved_virtual_stages_match_single_process(virtual: int) -> None:
    result = _results()[virtual]
    plan = result.job.plan
    assert plan.num_stages == 2 * virtual and plan.stage_to_rank == (0, 1) * virtual
    for r in result.reports:  # each rank ran its own stages of the loop
        assert sorted(r.stages) == list(range(r.pipeline_rank, 2 * virtual, 2))
    torch.manual_seed(0)
    want_params, want_grads = reference_step(LENET.build(), LENET, 12, steps=2)
    assert_close(merged(result, "grads"), want_grads)
    assert_close(merged(result, "params"), want_params)
