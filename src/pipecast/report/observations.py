"""The background studies' observations, checked against our own data."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.store import Row
from pipecast.planning.partition import Setting, analyze, partition
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.profile.types import Profile


def microbatch_trend(rows: Sequence[Row]) -> list[str]:
    """'Performance improves with micro-batches up to a point, then deteriorates.'"""
    series: dict[tuple[str, int], list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        cfg = BenchConfig.from_dict(r.config)
        if r.status == "ok" and r.measured and cfg.tags.get("study") == "gpipe":
            series[(cfg.workload.key, cfg.gpus)].append((cfg.microbatches, r.measured["step_time"]))
    out = []
    for (workload, splits), points in sorted(series.items()):
        if len(points) < 3:
            continue
        points.sort()
        best = min(range(len(points)), key=lambda i: points[i][1])
        m = points[best][0]
        if 0 < best < len(points) - 1:
            verdict = f"holds: fastest at {m} micro-batches, slower on both sides"
        elif best == 0:
            verdict = (
                f"does not hold here: fastest with the fewest ({m}); per-micro-batch "
                "overhead dominates"
            )
        else:
            verdict = f"not reached: still improving at {m} micro-batches"
        out.append(
            f"{workload}, {splits} split(s): {verdict} "
            f"({', '.join(f'M={mm}: {t * 1e3:.1f} ms' for mm, t in points)})."
        )
    return out


def communication_linearity(p2p: dict[str, list[list[float]]]) -> list[str]:
    """'Communication time is linear in the (micro-batch, hence tensor) size.'"""
    out = []
    for pair, samples in sorted(p2p.items())[:4]:
        x = np.array([s for s, _ in samples], dtype=float)
        t = np.array([v for _, v in samples], dtype=float)
        big = x >= 2**20
        if big.sum() < 3:
            continue
        slope, intercept = np.polyfit(x[big], t[big], 1)
        fit = slope * x[big] + intercept
        r2 = 1 - ((t[big] - fit) ** 2).sum() / ((t[big] - t[big].mean()) ** 2).sum()
        out.append(
            f"link {pair}: above 1 MiB, time = {intercept * 1e6:.1f} µs + bytes / "
            f"{1 / slope / 1e9:.1f} GB/s, R² = {r2:.4f}: "
            f"{'linear' if r2 > 0.99 else 'not linear'}."
        )
    return out


def balancing(profile: Profile, cluster: Cluster, stages: int) -> list[str]:
    """'Compute-only balancing is worse than communication-aware balancing.'"""
    size = max(profile.micro_batch_sizes)
    setting = Setting(micro_batch=size, memory_margin=0.0)
    rows = {}
    for method in ("forward", "compute", "balanced"):
        split = partition(profile, cluster, stages, setting, method)
        rows[method] = analyze(profile, split, cluster, size)
    c, b = rows["compute"], rows["balanced"]
    verdict = (
        "holds"
        if b.slowest < c.slowest - 1e-12
        else "no difference here: transfers are small against compute on these links"
    )
    return [
        f"{profile.model}, {stages} stages: forward-only balancing gives efficiency "
        f"{rows['forward'].efficiency_with_comm:.3f}, compute-only {c.efficiency_with_comm:.3f}, "
        f"communication-aware {b.efficiency_with_comm:.3f} (slowest stage "
        f"{c.slowest * 1e3:.2f} against {b.slowest * 1e3:.2f} ms): {verdict}."
    ]
