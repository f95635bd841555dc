"""The report's sections, each built from the results store's rows or a file the user named."""

from __future__ import annotations

import html
import os
from pathlib import Path
from urllib.parse import quote

from pipecast import jsonio
from pipecast.errors import DataError
from pipecast.orchestration.bench.accuracy import unlike
from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.predictions import unpredicted
from pipecast.orchestration.bench.spread import Unsettled, step_spread, unsettled
from pipecast.orchestration.bench.store import Row
from pipecast.planning.partition import METHODS, Setting, analyze, partition
from pipecast.report import observations, plots
from pipecast.report.gantt import gantt_stack
from pipecast.report.page import Section
from pipecast.report.trace import QUICK_LABEL
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.profile.types import Profile
from pipecast.values.timeline import Event

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


def profile_section(path: str, profile: Profile, cluster: Cluster | None, out: Path) -> Section:
    """A saved profile's (`profile`, read from `path`) per-block costs and, given a cluster,
    each partition method's efficiency on it."""
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


Samples = dict[str, list[list[float]]]
"""Point-to-point samples of a probe, by pair ('0->1'): [bytes, seconds] each."""

RAW_PROBE = "name the file `pipecast probe --raw FILE` wrote"


def read_probe(path: str) -> Samples:
    """The point-to-point samples in the raw probe file at `path` (pipecast probe --raw),
    checked as they are read: a missing, malformed or other kind of file is a one-line
    DataError naming it, before the report makes anything."""
    doc = jsonio.parse(jsonio.read_text(path), path)
    if not isinstance(doc, dict) or "kind" in doc or "p2p" not in doc:
        raise DataError(f"{path} holds {jsonio.describe(doc)}, not raw probe samples: {RAW_PROBE}")
    p2p = doc["p2p"]
    if not isinstance(p2p, dict) or not all(
        isinstance(samples, list)
        and all(
            isinstance(s, list)
            and len(s) == 2
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in s)
            for s in samples
        )
        for samples in p2p.values()
    ):
        raise DataError(
            f"{path} has damaged point-to-point samples (each pair's a list of [bytes, "
            f"seconds]): {RAW_PROBE}"
        )
    return p2p


def probe_section(path: str, p2p: Samples, out: Path) -> Section:
    """Point-to-point transfer time against tensor size, from a probe's raw samples (those
    `read_probe` read from `path`); where there are none, a line that says so."""
    section = Section("Communication against tensor size")
    if not any(p2p.values()):
        section.paragraphs.append(
            f"{path} holds no point-to-point samples (a probe of one device times no link): "
            "probe two devices or more to draw this"
        )
        return section
    if img := plots.communication(p2p, str(out / "communication.png")):
        section.images.append(img)
    section.paragraphs += observations.communication_linearity(p2p)
    return section


COMPUTE = ("F", "B", "W", "BW")


def trace_section(path: str, runs: list[tuple[str, list[Event]]], page: Path, out: Path) -> Section:
    """One run from its trace (`report.trace.read_trace`): each timeline in it (measured,
    and the prediction beside it where one was made) as a Gantt chart and a row of figures,
    and a link to the trace for Perfetto, relative to the page so that it opens from it."""
    name = Path(path).name.removesuffix(".json").removesuffix(".trace")
    link = Path(os.path.relpath(Path(path).resolve(), page.parent.resolve())).as_posix()
    section = Section(
        f"Run: {name}",
        [
            f'<a href="{html.escape(quote(link))}">{html.escape(path)}</a> (open in '
            "https://ui.perfetto.dev)",
            "Busy: the time each rank computed (F, B, W, BW). Idle: the share of the ranks' "
            "time to the last action that went without compute (the bubble, transfers and "
            "waits). A measured rank's times run from its own step start.",
        ],
    )
    section.table = [["timeline", "ranks", "last action ends", "busy per rank", "idle"]]
    for label, events in runs:
        ranks = max(e.rank for e in events) + 1
        end = max(e.end for e in events)  # from the step's start (0), as the chart draws it
        busy = [0.0] * ranks
        for e in events:
            if e.kind in COMPUTE:
                busy[e.rank] += e.duration
        idle = 1 - sum(busy) / (ranks * end) if end > 0 else 0.0
        section.table.append(
            [label, str(ranks), _ms(end), ", ".join(_ms(b) for b in busy), f"{idle:.0%}"]
        )
    if any(label.startswith(QUICK_LABEL) for label, _ in runs):
        section.paragraphs.append(
            "The prediction beside the measurement is the quick profile's that balanced the "
            "stages; its few repeats at one size do not price a step, so read its times as a "
            "sketch (`pipecast recommend` predicts from a full profile)."
        )
    chart = out / f"run_{name}.png"
    gantt_stack(runs, str(chart), title=name)
    section.images.append(str(chart))
    return section


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 10 else f"{seconds:.2f} s"
