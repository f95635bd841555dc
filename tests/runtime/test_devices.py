"""The device layer's host placement: parsing the kernel's CPU lists, pinning only on GPUs."""

from __future__ import annotations

import os

import pytest
import torch

from pipecast import devices


def test_parse_cpulist() -> None:
    assert devices.parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert devices.parse_cpulist("5") == {5}
    assert devices.parse_cpulist("") == set()


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux affinity calls")
def test_pinning_leaves_cpu_processes_alone() -> None:
    before = os.sched_getaffinity(0)
    with devices.pinned(torch.device("cpu")) as count:
        assert count == 0
        assert os.sched_getaffinity(0) == before
    assert devices.local_cpus(torch.device("cpu")) == set()
