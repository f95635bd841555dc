"""pipecast: pipeline-parallel training, and a planner that predicts the fastest strategy.

The loop: profile -> partition -> schedule -> simulate -> recommend -> run -> report.
Planning (profile types, partition, schedule, simulation, recommender) is pure functions
over typed dataclasses; only the runtime and the measuring parts of profile and hardware
touch devices.

    import pipecast
    result = pipecast.train(model, dataset="cifar10", gpus=2, schedule="zb-h1")
    outcome = pipecast.recommend("resnet50", dataset="imagenet", batch=256)

The names below load on first use, so `import pipecast` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pipecast.errors import PipecastError

if TYPE_CHECKING:
    from pipecast.api import infer, recommend, train
    from pipecast.planning.schedules.generators import make_plan
    from pipecast.planning.simulation.simulator import simulate
    from pipecast.values.plan.action import Plan
    from pipecast.values.profile.types import Profile

__version__ = "0.1.0"

__all__ = [
    "PipecastError",
    "Plan",
    "Profile",
    "__version__",
    "infer",
    "make_plan",
    "recommend",
    "simulate",
    "train",
]

_LAZY = {
    "train": "pipecast.api",
    "infer": "pipecast.api",
    "recommend": "pipecast.api",
    "make_plan": "pipecast.planning.schedules.generators",
    "simulate": "pipecast.planning.simulation.simulator",
    "Profile": "pipecast.values.profile.types",
    "Plan": "pipecast.values.plan.action",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pipecast' has no attribute {name!r}")
