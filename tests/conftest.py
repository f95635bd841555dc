"""Shared fixtures: every test starts from a fixed seed and single-threaded determinism."""

from __future__ import annotations

import gc

import pytest
import torch


def pytest_collection_finish(session: pytest.Session) -> None:
    """What the test modules imported lives as long as the session: frozen out of the
    garbage collector, each full collection the code under test makes (the profiler's
    before each micro-batch size, the runtime's before each job) walks only what the tests
    made since, not all of torch."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
