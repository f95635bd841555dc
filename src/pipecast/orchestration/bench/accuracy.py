"""Prediction accuracy: predicted against measured step time and memory, and whether the
strategy pipecast would pick is the one that measured fastest (the recommender
study's Tables 8.1 and 8.2, for pipecast)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from pipecast.orchestration.bench.store import Row
from pipecast.values.profile.stats import range_spread
from pipecast.values.timeline import HOST_BOUND

ROUNDS_AGREE = 0.10
"""Rounds of one configuration that lie within this fraction of their median measured it
repeatably. On the lent machines the same configuration measured minutes apart moved by as
much as half its time (docs/decisions.md, "Rounds"): no prediction can be nearer than the
measurement's own spread."""


@dataclass(frozen=True)
class Comparison:
    label: str
    group: str
    """Configurations in one group compete: same workload, batch and device budget."""
    predicted: float
    measured: float
    predicted_memory: float | None
    measured_memory: float | None
    host_share: float = 0.0
    """The prediction's busiest host over its step (see HOST_BOUND)."""
    host_drift: float | None = None
    """How much slower the host ran while this was measured than while the model was
    profiled (hostspeed readings; None: not recorded)."""
    round_spread: float | None = None
    """(slowest - fastest) / median of the rounds this configuration was measured in
    (None: measured once): how far the measurement itself moves."""
    graphed: bool = False
    """A CUDA-graphed run (BenchConfig.cuda_graphs), summarised apart."""
    gpus: int = 1
    """Devices (GPUs, or CPU ranks) the configuration ran on."""
    rounds: tuple[float, ...] = ()
    """The step time each round measured (empty: measured once)."""
    measured_reserved: float | None = None
    """The most any rank's allocator reserved: what an out-of-memory error follows."""

    @property
    def reserved_over(self) -> float | None:
        """(measured reserved - predicted peak) / predicted peak: how much more than the
        prediction the allocator held (negative: less); None where either is missing."""
        if not self.predicted_memory or not self.measured_reserved:
            return None
        return (self.measured_reserved - self.predicted_memory) / self.predicted_memory

    @property
    def repeatable(self) -> bool:
        """Measured in rounds that agree within ROUNDS_AGREE."""
        return self.round_spread is not None and self.round_spread <= ROUNDS_AGREE

    @property
    def host_bound(self) -> bool:
        return self.host_share >= HOST_BOUND

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured

    @property
    def memory_error(self) -> float | None:
        if not self.predicted_memory or not self.measured_memory:
            return None
        return (self.predicted_memory - self.measured_memory) / self.measured_memory


@dataclass(frozen=True)
class Decision:
    group: str
    picked: str
    fastest: str
    slowdown: float
    """Measured step time of the pick over the measured fastest, minus one (0: right)."""


HOST_DRIFT_LIKE = 1.25
"""A CPU row computes on its host, so its step follows the host's speed: measured with the
host more than this much faster or slower than while its profile was taken (the
hostspeed reference loop, read around both), it is not like the prediction's inputs. The
bound is the quick suite's own error budget (25%): a drift past it alone would spend it."""


def unlike(row: Row) -> str | None:
    """Why a CPU row's measurement is not like its prediction's inputs: its ranks, or its
    profile, waited for a core (bench.sharing), or the host's speed moved past
    HOST_DRIFT_LIKE between profile and run (None: like for like, or not read)."""
    from pipecast.orchestration.bench.sharing import shared_reason

    if row.config.get("device") != "cpu" or not row.measured:
        return None
    predicted = row.predicted or {}
    basis = predicted.get("basis") or {}
    ranks = row.measured.get("waited")
    shared = shared_reason(max(ranks) if ranks else None, "its slowest rank") or shared_reason(
        basis.get("waited"), "its profile"
    )
    drift = _drift(row.measured.get("host_reference"), predicted.get("host_reference"))
    if shared or drift is None or 1 / HOST_DRIFT_LIKE <= drift <= HOST_DRIFT_LIKE:
        return shared
    how = f"{1 / drift:.2f}x as fast" if drift < 1 else f"{drift:.2f}x as slow"
    profiled = predicted["host_reference"] * 1e3
    return (
        f"the host ran {how} as while its profile was taken (the reference loop: "
        f"{drift * profiled:.1f} ms against {profiled:.1f} ms)"
    )


def comparisons(rows: Iterable[Row]) -> list[Comparison]:
    """Every measured row with a prediction made like for like (see `unlike`)."""
    from pipecast.orchestration.bench.config import BenchConfig

    out = []
    for r in rows:
        if r.status != "ok" or not r.predicted or not r.measured:
            continue
        if "step_time" not in r.predicted or unlike(r) is not None:
            continue
        cfg = BenchConfig.from_dict(r.config)
        group = f"{cfg.workload.key} b{cfg.batch} on {cfg.gpus} device{'s' * (cfg.gpus > 1)}"
        mem = r.measured.get("peak_allocated")
        out.append(
            Comparison(
                cfg.label(),
                group,
                r.predicted["step_time"],
                r.measured["step_time"],
                max(r.predicted["peak_memory"]) if r.predicted.get("peak_memory") else None,
                max(mem) if mem else None,
                float(r.predicted.get("host_share", 0.0)),
                _drift(r.measured.get("host_reference"), r.predicted.get("host_reference")),
                _spread(r.measured.get("rounds")),
                cfg.cuda_graphs,
                cfg.gpus,
                tuple(r.measured.get("rounds") or ()),
                max(reserved) if (reserved := r.measured.get("peak_reserved")) else None,
            )
        )
    return out


def _spread(rounds: list[float] | None) -> float | None:
    return range_spread(rounds) if rounds and len(rounds) > 1 else None


def _drift(measured: list[float] | None, profiled: float | None) -> float | None:
    if not measured or not profiled:
        return None
    return statistics.median(measured) / profiled


def decisions(comps: list[Comparison]) -> list[Decision]:
    groups: dict[str, list[Comparison]] = {}
    for c in comps:
        groups.setdefault(c.group, []).append(c)
    out = []
    for group, items in groups.items():
        if len(items) < 2:
            continue
        picked = min(items, key=lambda c: c.predicted)
        fastest = min(items, key=lambda c: c.measured)
        out.append(
            Decision(group, picked.label, fastest.label, picked.measured / fastest.measured - 1.0)
        )
    return out


def summary(comps: list[Comparison]) -> dict[str, float | int]:
    """Error statistics over all eager comparisons, and apart for host-bound predictions;
    CUDA-graphed runs apart (graphed_*), and the picks among eager and graphed runs
    together (*_with_graphs), as `recommend --cuda-graphs` picks."""
    graphed = [c for c in comps if c.graphed]
    out: dict[str, float | int] = {}
    if graphed:
        out |= {f"graphed_{k}": v for k, v in _errors(graphed).items()}
        both = decisions(comps)
        out["decisions_with_graphs"] = len(both)
        out["right_with_graphs"] = sum(d.slowdown == 0 for d in both)
        comps = [c for c in comps if not c.graphed]
    out |= _errors(comps)
    picks = decisions(comps)
    out |= {
        "decisions": len(picks),
        "right": sum(d.slowdown == 0 for d in picks),
        "within_5_percent": sum(d.slowdown <= 0.05 for d in picks),
    }
    parts = [
        ("device_bound", [c for c in comps if not c.host_bound]),
        ("host_bound", [c for c in comps if c.host_bound]),
    ]
    spreads = [c.round_spread for c in comps if c.round_spread is not None]
    if spreads:  # measured in rounds: how repeatable the measurement was, and the errors
        # where it was (a miss there is the model's; elsewhere it may be the moment's)
        out["round_spread_median"] = statistics.median(spreads)
        out["round_spread_worst"] = max(spreads)
        parts.append(("repeatable", [c for c in comps if c.repeatable]))
    for name, part in parts:
        for key, value in _errors(part).items():
            out[f"{name}_{key}"] = value
    # where the host binds, the step follows the host's speed: the predictions scaled to the
    # host speed read while each configuration ran (a diagnosis, not a prediction)
    drifted = [c for c in comps if c.host_bound and c.host_drift]
    if drifted:
        out["host_bound_median_abs_error_at_run_host_speed"] = statistics.median(
            abs(c.predicted * (c.host_drift or 1.0) / c.measured - 1.0) for c in drifted
        )
        out["host_drift_median"] = statistics.median(c.host_drift or 1.0 for c in drifted)
    return out


def _errors(comps: list[Comparison]) -> dict[str, float | int]:
    """Counts always; a median or worst only where there is something to take it of
    (never a NaN): memory errors where some row measured its peak memory, with how many
    ('memory_configurations'; torch does not count what CPU ranks allocate)."""
    errors = [abs(c.error) for c in comps]
    mems = [abs(e) for c in comps if (e := c.memory_error) is not None]
    out: dict[str, float | int] = {
        "configurations": len(comps),
        "within_7_percent": sum(e <= 0.07 for e in errors),
        "within_20_percent": sum(e <= 0.2 for e in errors),
        "memory_configurations": len(mems),
    }
    if errors:
        out["median_abs_error"] = statistics.median(errors)
        out["worst_abs_error"] = max(errors)
    if mems:
        out["median_abs_memory_error"] = statistics.median(mems)
        out["worst_abs_memory_error"] = max(mems)
    over = [e for c in comps if (e := c.reserved_over) is not None]
    if over:
        out["reserved_configurations"] = len(over)
        out["median_reserved_over"] = statistics.median(over)
        out["worst_reserved_over"] = max(over)
        out["reserved_over_10_percent"] = sum(e > 0.1 for e in over)
    return out
