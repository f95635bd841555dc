"""The report's sections, each built from the results store's rows or a file the user named."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path

from pipecast.orchestration.bench.accuracy import unlike
from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.predictions import unpredicted
from pipecast.orchestration.bench.spread import Unsettled, step_spread, unsettled
from pipecast.orchestration.bench.store import Row
from pipecast.planning.partition import METHODS, Setting, analyze, partition
from pipecast.report import observations, plots
from pipecast.report.page import Section
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.profile.types import Profile

RESULTS_HEADER = [
    "suite",
    "configuration",
    "status",
    "samples/s",
    "step (ms)",
    "spread",
    "predicted (ms)",
    "error",
    "card",
    "notes",
]


def _notes(cfg: BenchConfig, row: Row, loose: Unsettled | None, unlike: str | None) -> str:
    """Why a measured row has no prediction, and whether its spread settles its order."""
    notes = []
    if unlike is not None:
        notes.append(f"not predicted like for like: {unlike}")
    elif row.status == "ok" and "step_time" not in (row.predicted or {}):
        notes.append(f"not predicted: {unpredicted(cfg) or NO_PREDICTION}")
    if loose is not None:
        notes.append(
            f"spread {loose.spread:.0%} is wider than the {loose.gap:.0%} gap to "
            f"{loose.nearest}: their order is not settled"
        )
    return "; ".join(notes)


NO_PREDICTION = "none was recorded with it"


def results(rows: list[Row], store_path: str, out: Path) -> Section:
    """Every configuration: status, speed, its steps' spread, predicted against measured
    step, the card, and notes (why it has no prediction; a spread wider than the gap to
    the nearest row it is compared with)."""
    section = Section(
        "Results",
        [
            f"{len(rows)} configurations in {store_path}. Spread: the interquartile range of "
            "a row's timed steps over their median."
        ],
    )
    loose = unsettled(rows)
    table = [RESULTS_HEADER]
    for r in rows:
        cfg = BenchConfig.from_dict(r.config)
        why = unlike(r)
        m, p = r.measured or {}, ({} if why else r.predicted or {})
        err = ""
        if "step_time" in m and "step_time" in p:
            err = f"{(p['step_time'] - m['step_time']) / m['step_time']:+.1%}"
        spread = step_spread(m.get("step_times") or [])
        table.append(
            [
                r.suite,
                cfg.label(),
                r.status if r.status == "ok" else f"{r.status}: {r.error}",
                f"{m['samples_per_second']:,.1f}" if "samples_per_second" in m else "",
                f"{m['step_time'] * 1e3:.2f}" if "step_time" in m else "",
                "" if spread is None else f"{spread:.0%}",
                f"{p['step_time'] * 1e3:.2f}" if "step_time" in p else "",
                err,
                str(r.environment.get("card", "")),
                _notes(cfg, r, loose.get(r.key), why),
            ]
        )
    section.table = table
    if img := plots.speedups(rows, str(out / "speedups.png")):
        section.images.append(img)
    return section


def micro_batch_study(rows: list[Row], out: Path) -> Section:
    """Step time against micro-batches and splits, as the GPipe study drew it."""
    section = Section("Micro-batches and splits (the GPipe study's figures)")
    if img := plots.gpipe_study(rows, str(out / "gpipe_study.png")):
        section.images.append(img)
    section.paragraphs += observations.microbatch_trend(rows)
    return section


def training_accuracy(rows: list[Row]) -> list[Section]:
    """Top-1 error after training on the real digits, where a row recorded it."""
    errors = [
        (BenchConfig.from_dict(r.config), r.measured["top1_error"])
        for r in rows
        if r.status == "ok" and r.measured and r.measured.get("top1_error") is not None
    ]
    if not errors:
        return []
    section = Section("Training accuracy on real data (digits)")
    section.table = [["configuration", "how", "top-1 error"]]
    section.table += [[c.label(), c.tags.get("accuracy", ""), f"{e:.1%}"] for c, e in errors]
    return [section]


def profile_section(path: str, cluster: Cluster | None, out: Path) -> Section:
    """A saved profile's per-block costs and, given a cluster, each partition method's
    efficiency on it."""
    profile = Profile.load(path)
    section = Section(f"Profile: {profile.model} on {profile.dataset} ({profile.device})")
    section.images.append(
        plots.profile_breakdown(profile, str(out / f"profile_{Path(path).stem}.png"))
    )
    if cluster is None:
        return section
    stages = min(4, profile.num_blocks)
    size = max(profile.micro_batch_sizes)
    setting = Setting(micro_batch=size, memory_margin=0.0)
    section.table = [["method", "boundaries", "efficiency (compute)", "efficiency (with comm)"]]
    for method in METHODS:
        rep = analyze(profile, partition(profile, cluster, stages, setting, method), cluster, size)
        section.table.append(
            [
                method,
                str(rep.boundaries),
                f"{rep.efficiency_compute:.3f}",
                f"{rep.efficiency_with_comm:.3f}",
            ]
        )
    section.paragraphs += observations.balancing(profile, cluster, stages)
    return section


def probe_section(probe: str, out: Path) -> Section:
    """Point-to-point transfer time against tensor size, from a probe's raw samples."""
    raw = json.loads(Path(probe).read_text())
    section = Section("Communication against tensor size")
    if img := plots.communication(raw.get("p2p", {}), str(out / "communication.png")):
        section.images.append(img)
    section.paragraphs += observations.communication_linearity(raw.get("p2p", {}))
    return section


def traces_section(traces: Sequence[str]) -> Section:
    """Links to trace files, to open in Perfetto."""
    return Section(
        "Traces",
        [
            f'<a href="{html.escape(t)}">{html.escape(t)}</a> (open in https://ui.perfetto.dev)'
            for t in traces
        ],
    )
