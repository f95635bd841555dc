"""A short report per benchmark run: environment, commit, table, verdict.

    python -m benchmarks.report --store DIR/bench.sqlite --suite runtime     # print it
    python -m benchmarks.report --store DIR/bench.sqlite --suite runtime --commit abc1234 \\
        --save          # benchmarks/reports/<date>_<hardware>_<suite>_<commit>.md + index.csv
    python -m benchmarks.report --traces DIR/traces.json --suite runtime --commit abc1234 --save

A runtime report checks the runtime's bars: pipecast's best pipeline against
torch.distributed.pipelining's best and against N x one GPU, each schedule at 16 and 32
micro-batches against 8, and pipecast on torch's own split, schedule and micro-batches. An
accuracy report gives the recommender's errors (pipecast.orchestration.bench.accuracy.summary).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks import studies_report as studies
from pipecast.orchestration.bench.accuracy import comparisons, summary
from pipecast.orchestration.bench.store import Row, Store
from pipecast.values.data.registry import epoch_samples

HERE = Path(__file__).resolve().parent
REPORTS = HERE / "reports"
INDEX = HERE / "results" / "index.csv"
INDEX_FIELDS = ["date", "hardware", "commit", "suite", "report", "headline"]


@dataclass(frozen=True)
class Measured:
    label: str
    step: float
    """Seconds per step (the median of the run's timed steps)."""
    samples: float
    """Samples per second."""
    predicted: float | None = None
    peak_allocated: int = 0
    """The largest of the GPUs' peak allocated bytes (0: not recorded)."""
    peak_reserved: int = 0
    epoch_samples: int = 0
    """Samples in one epoch of the workload's data set."""


_LABEL = re.compile(
    r"^(?P<workload>\S+) b(?P<batch>\d+) (?P<who>pipecast|torchgpipe|deepspeed|torch) "
    r"(?P<schedule>\S+) "
    r"(?P<rep>\d+x)?(?P<stages>\d+)st M=(?P<m>\d+)(?P<notes>.*)$"
)


@dataclass(frozen=True)
class Parsed:
    workload: str
    who: str
    """'pipecast', 'torch', 'single' or 'ddp'."""
    schedule: str = ""
    microbatches: int = 1
    notes: str = ""


def parse(label: str) -> Parsed:
    """What a BenchConfig.label() says: the workload, the system, schedule and M."""
    if m := _LABEL.match(label):
        return Parsed(m["workload"], m["who"], m["schedule"], int(m["m"]), m["notes"].strip())
    workload = label.split(" ")[0]
    # older stores' labels said "single GPU" and "DDP xN" whatever the device
    if acc := re.search(r" (?:single GPU|one device) acc(\d+)$", label):
        return Parsed(workload, "single", microbatches=int(acc[1]))
    ddp = " DDP x" in label or " data parallel x" in label
    return Parsed(workload, "ddp" if ddp else "single")


def runtime_verdict(rows: Sequence[Measured], gpus: int) -> list[str]:
    """The runtime's bars, one workload at a time, from the rows of one call."""
    lines: list[str] = []
    by_workload: dict[str, list[tuple[Parsed, Measured]]] = {}
    for r in rows:
        p = parse(r.label)
        by_workload.setdefault(p.workload, []).append((p, r))
    for workload, items in by_workload.items():
        single = [r for p, r in items if p.who == "single" and p.microbatches == 1]
        torch_pp = [(p, r) for p, r in items if p.who == "torch"]
        ours = [(p, r) for p, r in items if p.who == "pipecast" and "graphs" in p.notes]
        if not torch_pp or not ours:
            continue
        tp, tr = max(torch_pp, key=lambda x: x[1].samples)
        pp, pr = max(ours, key=lambda x: x[1].samples)
        lines.append(f"**{workload}**")
        lines.append(
            f"- pipecast's best, {pp.schedule} M={pp.microbatches}: {pr.samples:,.1f} samples/s;"
            f" torch.distributed.pipelining's best, {tp.schedule} M={tp.microbatches}: "
            f"{tr.samples:,.1f}: **{pr.samples / tr.samples:.3f}x**"
        )
        if single:
            ideal = gpus * single[0].samples
            lines.append(
                f"- against {gpus} x one GPU ({ideal:,.1f} samples/s): "
                f"**{pr.samples / ideal:.3f}** of the ideal"
            )
        same = [
            (r, tr2)
            for p, r in ours
            for tp2, tr2 in torch_pp
            if (p.schedule, p.microbatches) == (tp2.schedule, tp2.microbatches)
            and "split" not in p.notes
        ]
        for r, t in same:
            lines.append(
                f"- same split, schedule and M ({parse(r.label).schedule} "
                f"M={parse(r.label).microbatches}): pipecast {r.step * 1e3:.2f} ms, torch "
                f"{t.step * 1e3:.2f} ms: {t.step / r.step:.3f}x"
            )
        schedules = dict.fromkeys(p.schedule for p, _ in ours)
        for s in schedules:
            at = {p.microbatches: r for p, r in ours if p.schedule == s}
            if 8 in at and len(at) > 1:
                ratios = ", ".join(
                    f"M={m} {at[8].step / at[m].step:.3f}" for m in sorted(at) if m != 8
                )
                lines.append(f"- {s}, against its M=8: {ratios}")
    return lines


def accuracy_verdict(records: Sequence[Row]) -> list[str]:
    s = summary(comparisons(records))
    if not s["configurations"]:
        return ["- no configuration was both predicted and measured"]
    return [
        f"- {s['configurations']} configurations: median |error| {s['median_abs_error']:.1%}, "
        f"worst {s['worst_abs_error']:.1%}, {s['within_20_percent']} within 20%",
        f"- memory: median {s['median_abs_memory_error']:.1%}, worst "
        f"{s['worst_abs_memory_error']:.1%}"
        if s["memory_configurations"]
        else "- memory: no row measured its peak memory",
        f"- picks: {s['right']} of {s['decisions']} the measured fastest",
    ]


def _store_rows(records: Sequence[Row]) -> tuple[list[Measured], dict[str, object]]:
    rows, env = [], {}
    for r in records:
        env = r.environment or env
        if r.status != "ok" or not r.measured:
            continue
        from pipecast.orchestration.bench.config import BenchConfig

        cfg = BenchConfig.from_dict(r.config)
        step = r.measured["step_time"]
        predicted = r.predicted["step_time"] if r.predicted else None
        rows.append(
            Measured(
                cfg.label(), step, cfg.batch / step, predicted,
                max(r.measured.get("peak_allocated") or [0]),
                max(r.measured.get("peak_reserved") or [0]),
                epoch_samples(cfg.workload.dataset),
            )
        )  # fmt: skip
    return rows, env


def failures(records: Sequence[Row]) -> list[str]:
    """One line per configuration that did not run, with its error's first line."""
    from pipecast.orchestration.bench.config import BenchConfig

    out = []
    for r in records:
        if r.status != "ok":
            error = (r.error or r.status).strip().splitlines() or [r.status]
            out.append(f"- {BenchConfig.from_dict(r.config).label()}: {error[-1][:200]}")
    return out


def studies_verdict(rows: Sequence[Measured]) -> list[str]:
    """The studies' systems against pipecast and torch, one workload at a time: samples/s,
    time per epoch and peak memory (seeds/002 and seeds/003's metrics), then the same-split
    comparisons: pipecast's GPipe against torchgpipe's, its 1F1B against DeepSpeed's."""
    lines: list[str] = []
    by_workload: dict[str, list[tuple[Parsed, Measured]]] = {}
    for r in rows:
        by_workload.setdefault(parse(r.label).workload, []).append((parse(r.label), r))
    for workload, items in by_workload.items():
        items = [(p, r) for p, r in items if not (p.who == "single" and p.microbatches > 1)]
        lines += [f"**{workload}**", "", "| system | samples/s | epoch | peak allocated | "
                  "peak reserved |", "|---|---|---|---|---|"]  # fmt: skip
        for _, r in sorted(items, key=lambda x: -x[1].samples):
            epoch = f"{r.epoch_samples / r.samples / 60:,.1f} min" if r.epoch_samples else "-"
            lines.append(
                f"| {r.label.split(' ', 2)[2]} | {r.samples:,.1f} | {epoch} | "
                f"{r.peak_allocated / 2**30:.2f} GiB | {r.peak_reserved / 2**30:.2f} GiB |"
            )
        lines.append("")
        best = {
            who: max((r for p, r in items if p.who == who), key=lambda r: r.samples, default=None)
            for who in ("pipecast", "torch", "torchgpipe", "deepspeed")
        }
        ours = best["pipecast"]
        for who, r in best.items():
            if ours is not None and r is not None and who != "pipecast":
                lines.append(f"- pipecast's best against {who}'s best: "
                             f"**{ours.samples / r.samples:.3f}x**")  # fmt: skip
        pairs = (("gpipe", "torchgpipe", "gpipe"), ("1f1b", "deepspeed", "1f1b"))
        for mine, who, theirs in pairs:
            a = [r for p, r in items if p.who == "pipecast" and p.schedule == mine]
            b = [r for p, r in items if p.who == who and p.schedule == theirs and not p.notes]
            if a and b:
                lines.append(
                    f"- same split, {mine} M={parse(a[0].label).microbatches}: pipecast "
                    f"{a[0].step * 1e3:.2f} ms, {who} {b[0].step * 1e3:.2f} ms: "
                    f"{b[0].step / a[0].step:.3f}x"
                )
        lines.append("")
    return lines


def offload_verdict(records: Sequence[Row]) -> list[str]:
    """Per memory limit: the recommended configuration's predicted and measured step time
    and peak memory per GPU (the busiest rank's, and the worst rank's error), and its
    throughput against recomputation alone on the same split."""
    from pipecast.orchestration.bench.config import BenchConfig

    lines = [
        "| limit | role | configuration | step predicted | measured | peak predicted | "
        "measured | worst rank |",
        "|---|---|---|---|---|---|---|---|",
    ]
    steps: dict[tuple[str, str], float] = {}
    misses, measured = [], 0
    for r in records:
        if r.status != "ok" or not r.measured or not r.predicted:
            continue
        cfg = BenchConfig.from_dict(r.config)
        limit, role = cfg.tags.get("limit", "-"), cfg.tags.get("role", "-")
        step, pred = r.measured["step_time"], r.predicted["step_time"]
        steps[(limit, role)] = step
        want, got = r.predicted["peak_memory"], r.measured["peak_allocated"]
        memory = "- | - | -"  # CPU ranks: no allocator to read
        if max(got, default=0):
            errors = [w / g - 1 for w, g in zip(want, got, strict=True) if g]
            peak = max(want) / max(got) - 1
            if role == "recommended":
                measured += 1
                if abs(peak) > 0.10:
                    misses.append(limit)
            memory = (
                f"{max(want) / 2**30:.2f} GiB | {max(got) / 2**30:.2f} GiB ({peak:+.1%}) | "
                f"{max(errors, key=abs):+.1%}"
            )
        lines.append(
            f"| {limit} | {role} | {cfg.label()} | {pred * 1e3:.1f} ms | {step * 1e3:.1f} ms "
            f"({pred / step - 1:+.1%}) | {memory} |"
        )
    for (limit, role), step in steps.items():
        if role == "recommended" and (limit, "recompute") in steps:
            ratio = steps[(limit, "recompute")] / step
            lines.append(
                f"- {limit}: the recommendation runs at {ratio:.2f}x recomputation's speed"
            )
    verdict = "within 10%" if not misses else f"over 10% at {', '.join(misses)}"
    if not measured:
        verdict = "not measured (no GPU)"
    return [*lines, "", f"- peak memory of the recommended configurations: {verdict}"]


def thesis_verdict(records: Sequence[Row]) -> list[str]:
    """seeds/004's Table 8.1 / 8.2 cells beside pipecast's, and both models' errors."""
    table, lines = studies.thesis_table(records)
    return [*studies.markdown(table), "", *(f"- {line}" for line in lines)]


def table_4_1(records: Sequence[Row]) -> list[str]:
    table = studies.table_4_1(records)
    if not table:
        return []
    head = "**seeds/000 Table 4.1: one split of VGG16, batch 128, over micro-batches**"
    return [head, "", *studies.markdown(table), ""]


def _trace_rows(path: Path) -> list[Measured]:
    out = []
    for r in json.loads(path.read_text()):
        if r["rank"] == 0 and not r["error"] and r["step_ms"] > 0:
            step = r["step_ms"] / 1e3
            out.append(Measured(r["label"], step, r["samples_per_s"]))
    return out


def table(rows: Sequence[Measured]) -> list[str]:
    lines = ["| configuration | step | samples/s | predicted |", "|---|---|---|---|"]
    for r in rows:
        pred = (
            f"{r.predicted * 1e3:.2f} ms ({r.predicted / r.step - 1:+.1%})" if r.predicted else "-"
        )
        lines.append(f"| {r.label} | {r.step * 1e3:.2f} ms | {r.samples:,.1f} | {pred} |")
    return lines


def render(
    store: Path | None = None,
    *,
    suite: str,
    traces: Path | None = None,
    commit: str = "",
    hardware: str = "",
    date: str = "",
    notes: Sequence[str] = (),
) -> str:
    """The report's Markdown."""
    env: dict[str, object] = {}
    records: list[Row] = []  # the store's, read once
    if traces is not None:
        rows = _trace_rows(traces)
    else:
        assert store is not None
        records = list(Store(store).rows())
        rows, env = _store_rows(records)
    gpus = max(int(str(env.get("gpus", env.get("devices", 0))) or 0), _widest(rows))
    names = env.get("names") or ([env["card"]] if "card" in env else [])
    head = [
        f"# {suite}: {hardware or _hardware(env)}, {date or _today()}",
        "",
        "## Environment",
        f"- hardware: {gpus} x {names[0] if names else hardware or 'unknown'}",
        f"- torch {env.get('torch', 'unknown')}; pipecast commit {commit or head_commit()}",
    ]
    verdict: list[str] = []
    if suite == "runtime":
        verdict = runtime_verdict(rows, gpus)
    elif suite == "accuracy":
        verdict = accuracy_verdict(records)
    elif suite == "studies":
        verdict = studies_verdict(rows) + table_4_1(records)
    elif suite == "thesis":
        verdict = thesis_verdict(records)
    elif suite == "offload":
        verdict = offload_verdict(records)
    if failed := failures(records):
        verdict += ["", "Did not run:", *failed]
    body = [*head, "", "## Result", "", *table(rows), ""]
    if verdict or notes:
        body += ["## Verdict", "", *verdict, *notes, ""]
    return "\n".join(body)


def _widest(rows: Sequence[Measured]) -> int:
    widths = [int(m[1]) for r in rows if (m := re.search(r"(\d+)st M=", r.label))]
    widths += [
        int(m[1]) for r in rows if (m := re.search(r"(?:DDP|data parallel) x(\d+)", r.label))
    ]
    return max(widths, default=1)


def _hardware(env: dict[str, object]) -> str:
    names = env.get("names") or ["unknown"]
    assert isinstance(names, list)
    return f"{env.get('gpus', len(names))} x {names[0]}"


def _today() -> str:
    return datetime.date.today().isoformat()


def head_commit(unknown: str = "unknown") -> str:
    """This checkout's short commit hash (`unknown` outside git)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return unknown


def headline(text: str) -> str:
    """The verdict's bold figures, by workload: 'vgg16/imagenet 1.093x, 0.740; ...'."""
    parts, workload, figures = [], "", []
    for line in text.splitlines():
        if line.startswith("**") and line.endswith("**"):
            if workload:
                parts.append(f"{workload} {', '.join(figures)}")
            workload, figures = line.strip("*"), []
        elif workload:
            figures += re.findall(r"\*\*([^*]+)\*\*", line)
    if workload:
        parts.append(f"{workload} {', '.join(figures)}")
    return "; ".join(parts) or text.splitlines()[0].removeprefix("# ")


def save(text: str, *, date: str, hardware: str, commit: str, suite: str, headline: str) -> Path:
    """Write the report as reports/<date>_<hardware>_<suite>_<commit>.md and index it."""
    REPORTS.mkdir(exist_ok=True)
    path = REPORTS / f"{date}_{hardware}_{suite}_{commit}.md"
    path.write_text(text)
    new = not INDEX.exists()
    with open(INDEX, "a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=INDEX_FIELDS)
        if new:
            writer.writeheader()
        writer.writerow(
            {
                "date": date,
                "hardware": hardware,
                "commit": commit,
                "suite": suite,
                "report": f"reports/{path.name}",
                "headline": headline,
            }
        )
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--store", type=Path, help="a run's bench.sqlite")
    source.add_argument("--traces", type=Path, help="benchmarks/traces.py's traces.json")
    parser.add_argument(
        "--suite",
        required=True,
        choices=("runtime", "accuracy", "anchors", "quick", "studies", "thesis", "offload"),
    )
    parser.add_argument("--commit", default="", help="the commit the run measured")
    parser.add_argument("--hardware", default="", help="e.g. h200x2")
    parser.add_argument("--date", default="", help="YYYY-MM-DD (default: today)")
    parser.add_argument("--note", action="append", default=[], help="a line for the verdict")
    parser.add_argument("--save", action="store_true", help="into reports/ and the index")
    args = parser.parse_args(argv)
    text = render(
        args.store,
        suite=args.suite,
        traces=args.traces,
        commit=args.commit,
        hardware=args.hardware,
        date=args.date,
        notes=[f"- {n}" for n in args.note],
    )
    if args.save:
        if not (args.commit and args.hardware):
            parser.error("--save needs --commit and --hardware (they name the file)")
        path = save(
            text,
            date=args.date or _today(),
            hardware=args.hardware,
            commit=args.commit,
            suite=args.suite,
            headline=headline(text),
        )
        print(path)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
