"""Shared fixtures: every test starts from a fixed seed and single-threaded determinism."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
