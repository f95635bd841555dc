"""The device layer's host placement: pinning only on GPUs."""

from __future__ import annotations

import os

import pytest
import torch

from pipecast.runtime import devices


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux affinity calls")
def test_pinning_leaves_cpu_processes_alone() -> None:
    before = os.sched_getaffinity(0)
    with devices.pinned(torch.device("cpu")) as count:
        assert count == 0
        assert os.sched_getaffinity(0) == before
    assert devices.local_cpus(torch.device("cpu")) == set()
