"""The plots the background studies drew, from the results store, profiles and probes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from pipecast.orchestration.bench.accuracy import Comparison
from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.store import Row
from pipecast.report.figure_file import save_figure
from pipecast.values.profile.types import Profile


def _save(fig: Figure, path: str) -> str:
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def gpipe_study(rows: Sequence[Row], path: str) -> str | None:
    """End-to-end step time against micro-batches, one line per split count."""
    series: dict[str, dict[int, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        cfg = BenchConfig.from_dict(r.config)
        if r.status == "ok" and r.measured and cfg.tags.get("study") == "gpipe":
            series[cfg.workload.key][cfg.gpus].append((cfg.microbatches, r.measured["step_time"]))
    if not series:
        return None
    fig, axes = plt.subplots(1, len(series), figsize=(5.5 * len(series), 4), squeeze=False)
    for ax, (workload, by_split) in zip(axes[0], sorted(series.items()), strict=True):
        for splits, points in sorted(by_split.items()):
            points.sort()
            ax.plot(
                [m for m, _ in points],
                [t * 1e3 for _, t in points],
                marker="o",
                label=f"{splits} split(s)",
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("micro-batches")
        ax.set_ylabel("step time (ms)")
        ax.set_title(workload, fontsize=9)
        ax.legend(fontsize=8)
    return _save(fig, path)


def speedups(rows: Sequence[Row], path: str) -> str | None:
    """Samples/s of every configuration of a suite relative to one device (or, where the suite
    has none, to torch.distributed.pipelining's 1F1B), per workload."""
    groups: dict[str, dict[str, float]] = defaultdict(dict)
    base: dict[str, tuple[str, float]] = {}
    for r in rows:
        if r.status != "ok" or not r.measured or "samples_per_second" not in r.measured:
            continue
        cfg = BenchConfig.from_dict(r.config)
        if cfg.accuracy_steps:
            continue
        key = f"{r.suite}: {cfg.workload.key} b{cfg.batch}"
        label = cfg.label().split(f"b{cfg.batch} ", 1)[-1]
        value = r.measured["samples_per_second"]
        groups[key][label] = value
        if cfg.system == "single" and cfg.microbatches == 1:
            base[key] = ("one device", value)
        elif (
            cfg.system == "torch"
            and cfg.schedule == "1f1b"
            and key not in base
            and cfg.tags.get("split", "same") == "same"
        ):
            base[key] = (label, value)
    groups = {k: v for k, v in groups.items() if k in base and len(v) > 1}
    if not groups:
        return None
    height = 0.3 * sum(len(v) for v in groups.values()) + 1.6 * len(groups)
    fig, axes = plt.subplots(len(groups), 1, figsize=(10, height), squeeze=False)
    for ax, (key, items) in zip(axes[:, 0], groups.items(), strict=True):
        name, reference = base[key]
        ordered = sorted(items.items(), key=lambda item: item[1])
        colours = [
            "#C44E52"
            if n.startswith("torch")
            else "#4C72B0"
            if n.startswith("pipecast")
            else "#8C8C8C"
            for n, _ in ordered
        ]
        ax.barh(range(len(ordered)), [v / reference for _, v in ordered], color=colours)
        ax.set_yticks(range(len(ordered)), [n for n, _ in ordered], fontsize=7)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel(f"samples/s relative to {name}")
        ax.set_title(key, fontsize=9)
    return _save(fig, path)


def accuracy(comps: Sequence[Comparison], path: str) -> str | None:
    """Predicted against measured on log axes (steps span milliseconds to seconds), host-bound
    predictions marked apart: their error is the host's, which varies between machines. A
    configuration measured in rounds has a line from its fastest round to its slowest: how
    far the measurement itself moved."""
    if not comps:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for bound, label, marker, color in (
        (False, "device-bound", "o", "C0"),
        (True, "host-bound", "x", "C1"),
    ):
        part = [c for c in comps if c.host_bound == bound]
        if part:
            ax.scatter(
                [c.measured * 1e3 for c in part],
                [c.predicted * 1e3 for c in part],
                s=22,
                marker=marker,
                color=color,
                label=f"{label} ({len(part)})",
            )
            spread = [c for c in part if len(c.rounds) > 1]
            if spread:
                ax.hlines(
                    [c.predicted * 1e3 for c in spread],
                    [min(c.rounds) * 1e3 for c in spread],
                    [max(c.rounds) * 1e3 for c in spread],
                    colors=color,
                    linewidth=0.8,
                    alpha=0.6,
                )
    values = [v * 1e3 for c in comps for v in (c.measured, c.predicted, *c.rounds) if v > 0]
    low, top = min(values) / 1.3, max(values) * 1.3
    ax.plot([low, top], [low, top], color="black", linewidth=0.8)
    for band in (0.9, 1.1):
        ax.plot([low, top], [low * band, top * band], color="grey", linewidth=0.5, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("predicted step time (ms)")
    ax.set_title("predicted against measured (dashed: ±10%; lines: rounds)", fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, path)


def profile_breakdown(profile: Profile, path: str) -> str:
    size = max(profile.micro_batch_sizes)
    costs = [profile.cost(i, size) for i in range(profile.num_blocks)]
    x = np.arange(profile.num_blocks)
    f = np.array([c.forward for c in costs]) * 1e3
    b = np.array([c.backward_input for c in costs]) * 1e3
    w = np.array([c.backward_weight for c in costs]) * 1e3
    fig, ax = plt.subplots(figsize=(max(6, 0.22 * len(x) + 2), 3.6))
    ax.bar(x, f, label="forward", color="#4C72B0")
    ax.bar(x, b, bottom=f, label="backward: input (B)", color="#DD8452")
    ax.bar(x, w, bottom=f + b, label="backward: weights (W)", color="#55A868")
    ax.set_xlabel("block")
    ax.set_ylabel("ms")
    ax.set_title(
        f"{profile.model} on {profile.dataset}, {profile.device}, micro-batch {size}", fontsize=9
    )
    ax.legend(fontsize=8)
    return _save(fig, path)


def communication(p2p: dict[str, list[list[float]]], path: str) -> str | None:
    if not p2p:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for pair, samples in sorted(p2p.items())[:6]:
        ax.plot(
            [s / 2**20 for s, _ in samples], [t * 1e3 for _, t in samples], marker=".", label=pair
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message (MiB)")
    ax.set_ylabel("one-way time (ms)")
    ax.set_title("point-to-point time against tensor size", fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, path)
