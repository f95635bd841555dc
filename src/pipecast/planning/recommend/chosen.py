"""The strategy a recommendation file says to run, as what a training run needs.

`pipecast recommend` writes, beside its ranking, the workload and precision it predicted for
and the strategy to run: the measured fastest where it validated, else the predicted fastest,
each with its partition's boundaries. `pipecast train --recommendation FILE` runs that (or,
with `--pick N`, the N-th of the ranking), so the plan that was predicted is the one that runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipecast.errors import ConfigError
from pipecast.values.models.workload import Workload
from pipecast.values.plan.action import Plan
from pipecast.values.strategy import Strategy


@dataclass(frozen=True)
class Chosen:
    strategy: Strategy
    boundaries: tuple[int, ...]
    batch: int
    label: str
    workload: Workload | None
    """None: a file written before recommendations named their workload."""
    device: str = "cpu"
    dtype: str = "fp32"
    autocast: bool = False
    optimizer: str = "sgd"
    predicted: float = 0.0
    """Predicted seconds per step."""
    peak_memory: int = 0
    """Predicted peak bytes per GPU (0: not recorded)."""
    host_memory: int = 0
    """Predicted pinned host bytes of the whole run (0: nothing offloaded, or not
    recorded)."""
    plan: Plan | None = None
    """The plan that was predicted (None: a file from before plans were recorded, rebuilt
    from the schedule's name): a schedule searched on costs (zb-auto) runs as searched."""

    @property
    def schedule(self) -> str:
        """The plan's schedule: with one stage, micro-batches accumulate under 1F1B."""
        return self.strategy.schedule if self.strategy.kind in ("pipeline", "hybrid") else "1f1b"

    @property
    def partition(self) -> str:
        return ",".join(str(b) for b in self.boundaries)


def chosen(doc: dict[str, Any], pick: int = 0) -> Chosen:
    """What `doc` (a recommendation file's contents) says to run: `pick` 0 for its choice,
    N for the N-th of its ranking (from 1)."""
    if "ranked" not in doc or "batch" not in doc:
        kind = f"a '{doc['kind']}' file" if isinstance(doc.get("kind"), str) else "some other file"
        raise ConfigError(
            f"this is {kind}, not a recommendation: pass what `pipecast recommend -o` wrote"
        )
    ranked = doc.get("ranked") or []
    if pick:
        if not 1 <= pick <= len(ranked):
            raise ConfigError(
                f"the recommendation ranks {len(ranked)} strategies: pick 1 to {len(ranked)}"
            )
        entry = ranked[pick - 1]
    elif doc.get("run"):
        entry = doc["run"]
    elif ranked:
        entry = ranked[0]
    else:
        raise ConfigError(
            "the recommendation ranks no strategy: nothing fits to run (recommend again with "
            "more GPUs, a smaller batch or more memory)"
        )
    if "strategy" not in entry or "partition" not in entry:
        raise ConfigError(
            "not a pipecast recommendation file: no strategy and partition (pass what "
            "`pipecast recommend -o` wrote)"
        )
    workload = doc.get("workload")
    return Chosen(
        strategy=Strategy.from_dict(entry["strategy"]),
        boundaries=tuple(int(b) for b in entry["partition"]),
        batch=int(doc["batch"]),
        label=str(entry.get("label", "")),
        workload=Workload.from_dict(workload) if workload else None,
        device=str(doc.get("device", "cpu")),
        dtype=str(doc.get("dtype", "fp32")),
        autocast=bool(doc.get("autocast", False)),
        optimizer=str(doc.get("optimizer", "sgd")),
        predicted=float(entry.get("step_time", 0.0)),
        peak_memory=int(entry.get("peak_memory", 0)),
        host_memory=int(entry.get("host_memory", 0)),
        plan=Plan.from_text(entry["plan"]) if entry.get("plan") else None,
    )
