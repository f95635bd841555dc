"""Vocabulary of a training setup shared by planning and runtime: optimizers, recomputation."""

from __future__ import annotations

from typing import Literal

Optimizer = Literal["sgd", "momentum", "adam"]
Recompute = Literal["none", "all", "all-but-last"]

OPTIMIZER_STATE: dict[str, float] = {"sgd": 0.0, "momentum": 1.0, "adam": 2.0}
"""Optimizer state per parameter, in units of the parameter's bytes."""
