"""User-facing errors.

Every error a user can cause is a `PipecastError` whose message names the rule, the values
that broke it and what to do. The CLI prints the message on one line and exits with code 2.
"""

from __future__ import annotations


class PipecastError(Exception):
    """Base class of every error caused by input the user can fix."""


class UnknownNameError(PipecastError):
    """A model, data set, schedule or method name that is not registered."""

    def __init__(self, kind: str, name: str, valid: list[str] | tuple[str, ...]) -> None:
        super().__init__(f"unknown {kind} '{name}': choose one of {', '.join(sorted(valid))}")


class ShapeError(PipecastError):
    """A model that cannot take an input shape, or a block that fails on its input."""


class DataError(PipecastError):
    """A missing or malformed data file."""


class ConfigError(PipecastError):
    """Numbers that cannot work together (batch sizes, stage counts, memory, clusters)."""


class PlanError(PipecastError):
    """A schedule that is incomplete, misordered or would deadlock."""


class DeviceError(PipecastError):
    """A device that is absent or has too little memory."""


class RuntimeTimeout(PipecastError):
    """A distributed wait that did not finish within its timeout."""
