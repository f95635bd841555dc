"""pipecast: pipeline-parallel training and a planner that predicts the fastest strategy.

The loop: profile -> partition -> schedule -> simulate -> recommend -> run -> report.
Planning modules (profile types, partition, schedule, simulate, recommend) are pure
functions over typed dataclasses; only `runtime` and the measuring parts of `profile` and
`hardware` touch devices.
"""

from pipecast.errors import PipecastError

__version__ = "0.1.0"

__all__ = ["PipecastError", "__version__"]
