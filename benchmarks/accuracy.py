"""How far pipecast's predictions fall from what runs measured, and the ranges it quotes.

Three steps, each reading what the one before wrote:

    # every configuration of GPU run folders, re-predicted by this checkout from each run's
    # own profiles and probe, and from the shipped profiles and the preset (CPU only)
    python -m benchmarks.accuracy rows --run RUN_DIR [--run ...] --out benchmarks/results/rows.csv
    # strategies `pipecast recommend --validate` measured on CPU ranks, re-predicted
    python -m benchmarks.accuracy cpu-rows --validate DIR --out benchmarks/results/cpu_rows.csv
    # the error ranges `pipecast recommend` quotes, with where they came from
    python -m benchmarks.accuracy bands --write src/pipecast/planning/recommend/error_ranges.json
    # per run: median and worst error, rows within 20%, memory, picks
    python -m benchmarks.accuracy summary [--shipped]
    # a runtime call's pipecast rows (benchmarks/traces.py), predicted without the GPUs
    python -m benchmarks.accuracy runtime --traces DIR/traces.json --kind h200

A run folder is what `python -m benchmarks.run accuracy` writes: bench.sqlite, cluster.json
and profile_*.json.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import math
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.report import head_commit
from pipecast.orchestration.bench.accuracy import Comparison, comparisons, decisions
from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.predictions import predictions
from pipecast.orchestration.bench.store import Row, Store
from pipecast.values.hardware.cluster import DDP_PARAM_HOST, Cluster
from pipecast.values.hardware.presets import PRESETS, gpu_kind
from pipecast.values.models.workload import Workload
from pipecast.values.profile.reference import shipped
from pipecast.values.profile.types import Profile

RESULTS = Path(__file__).resolve().parent / "results"
ROWS = RESULTS / "rows.csv"
CPU_ROWS = RESULTS / "cpu_rows.csv"
FIELDS = [
    "run", "kind", "label", "group", "gpus", "graphed", "host_share", "host_drift",
    "round_spread", "predicted_s", "measured_s", "predicted_bytes", "measured_bytes",
    "shipped_predicted_s", "shipped_predicted_bytes",
]  # fmt: skip
CPU_FIELDS = ["recommendation", "label", "predicted_s", "measured_s"]


# ---- re-predicting run folders ----------------------------------------------------------


def run_profiles(run: Path) -> dict[str, Profile]:
    """The run's profiles (profile_*.json), by workload key; the targets' bytes and a B
    call's host cost filled in where the profiler did not yet record them."""
    out = {}
    for path in sorted(glob.glob(str(run / "profile_*.json"))):
        if path.endswith("profile_bars.json"):
            continue
        profile = Profile.load(path)
        if profile.workload:
            workload = Workload.from_dict(profile.workload)
            if not profile.target_bytes_per_sample:
                itemsize = profile.input_bytes_per_sample // math.prod(workload.spec.sample_shape)
                target = workload.spec.target_bytes(itemsize)
                profile = replace(profile, target_bytes_per_sample=target)
            out[workload.key] = profile
    call = _split_call_estimate(out.values())
    return {
        k: replace(p, host_split_call=call) if p.host_split_call == 0.0 else p
        for k, p in out.items()
    }


def _split_call_estimate(profiles: Iterable[Profile]) -> float:
    """A B call's own host cost, for runs profiled before the profiler measured it: a
    weightless block's lone B less its forward, the median over such blocks, the least
    over sizes (zero without such blocks)."""
    gaps: dict[int, list[float]] = {}
    for profile in profiles:
        for b in profile.blocks[1:]:
            for mb, c in b.costs.items() if b.params == 0 else ():
                gaps.setdefault(mb, []).append(c.host_backward_input - c.host_forward)
    medians = [statistics.median(g) for g in gaps.values()]
    return max(min(medians), 0.0) if medians else 0.0


def _as_probed_now(cluster: Cluster) -> Cluster:
    """A stored probe as this checkout's probe writes it (DDP's host cost per parameter
    tensor fixed where the probe read DDP's costs at all)."""
    if cluster.ddp_step_host == 0.0 and cluster.ddp_param_host == 0.0:
        return cluster
    return replace(cluster, ddp_param_host=DDP_PARAM_HOST)


def repredicted(run: Path, profiles: dict[str, Profile], cluster: Cluster) -> list[Row]:
    """The rows of `run` with every prediction made afresh from `profiles` and `cluster`."""
    rows = list(Store(run / "bench.sqlite").rows())
    configs = [BenchConfig.from_dict(r.config) for r in rows]
    predicted = predictions(configs, profiles, cluster)
    return [
        replace(r, predicted=predicted.get(cfg.key, r.predicted))
        for r, cfg in zip(rows, configs, strict=True)
    ]


def run_rows(run: Path) -> list[dict[str, Any]]:
    """One CSV row per configuration of `run` that both measured and predicted."""
    own_cluster = Cluster.load(str(run / "cluster.json"))
    kind = gpu_kind(own_cluster.device) or "cpu"
    own = comparisons(repredicted(run, run_profiles(run), _as_probed_now(own_cluster)))
    by_label: dict[str, Comparison] = {}
    if kind in ("h100", "h200"):
        ship = {Workload.from_dict(p.workload).key: p for p in shipped(kind)}
        preset = PRESETS[f"{kind}-nvlink"].subset(own_cluster.world)
        by_label = {c.label: c for c in comparisons(repredicted(run, ship, preset))}
    out = []
    for c in own:
        other = by_label.get(c.label)
        out.append(
            {
                "run": run.name, "kind": kind, "label": c.label, "group": c.group,
                "gpus": c.gpus, "graphed": int(c.graphed), "host_share": c.host_share,
                "host_drift": c.host_drift or "", "round_spread": c.round_spread or "",
                "predicted_s": c.predicted, "measured_s": c.measured,
                "predicted_bytes": c.predicted_memory or "",
                "measured_bytes": c.measured_memory or "",
                "shipped_predicted_s": other.predicted if other else "",
                "shipped_predicted_bytes": (other.predicted_memory or "") if other else "",
            }
        )  # fmt: skip
    return out


# ---- reading rows back -----------------------------------------------------------------


def _float(v: str) -> float | None:
    return float(v) if v not in ("", None) else None


def load_rows(path: Path = ROWS, *, shipped_path: bool = False) -> list[tuple[str, Comparison]]:
    """(run, comparison) for every row; `shipped_path`: the prediction from the shipped
    profiles and the preset in place of the run's own (rows without one left out)."""
    out = []
    with open(path) as fh:
        for r in csv.DictReader(fh):
            predicted = _float(r["shipped_predicted_s" if shipped_path else "predicted_s"])
            if predicted is None:
                continue
            memory = r["shipped_predicted_bytes" if shipped_path else "predicted_bytes"]
            out.append(
                (
                    r["run"],
                    Comparison(
                        label=r["label"],
                        group=r["group"],
                        predicted=predicted,
                        measured=float(r["measured_s"]),
                        predicted_memory=_float(memory),
                        measured_memory=_float(r["measured_bytes"]),
                        host_share=float(r["host_share"]),
                        host_drift=_float(r["host_drift"]),
                        round_spread=_float(r["round_spread"]),
                        graphed=r["graphed"] == "1",
                        gpus=int(r["gpus"]),
                    ),
                )
            )
    return out


# ---- the ranges recommend quotes --------------------------------------------------------

SLOWER = 1.25
"""The loop's reading over the profile's from which host-bound predictions ran slow
(pipecast.planning.recommend.host_drift.SLOWER)."""


def _range(errors: Sequence[float]) -> list[float]:
    """The 10th and 90th percentiles of signed errors, rounded outward to whole per cents."""
    deciles = statistics.quantiles(errors, n=10, method="inclusive")
    # round(..., 9): a decile at a whole per cent stays there, float noise notwithstanding
    low, high = round(deciles[0] * 100, 9), round(deciles[-1] * 100, 9)
    return [math.floor(low) / 100, math.ceil(high) / 100]


def bands(rows: list[tuple[str, Comparison]], cpu: list[float]) -> dict[str, Any]:
    """The error ranges by regime, the CPU range, and how much slower host-bound steps ran
    where the host had slowed (SLOWER), each with the rows it rests on."""
    eager = [c for _, c in rows if not c.graphed]
    regimes: dict[str, Any] = {}
    for regime in ("device", "host"):
        for gpus in ("one GPU", "several GPUs"):
            errors = [
                c.error
                for c in eager
                if (c.host_bound == (regime == "host")) and ((c.gpus == 1) == (gpus == "one GPU"))
            ]
            regimes[f"{regime}|{gpus}"] = {
                "range": _range(errors),
                "rows": len(errors),
                "median": round(statistics.median(errors), 4),
            }
    slowed = [c.error for c in eager if c.host_bound and (c.host_drift or 0) >= SLOWER]
    return {
        "note": "written by benchmarks/accuracy.py bands; do not edit by hand",
        "commit": head_commit(unknown=""),
        "runs": sorted({run for run, _ in rows}),
        "error_range": regimes,
        "cpu_error_range": {"range": _range(cpu), "rows": len(cpu)},
        "slower_miss": {
            "value": round(-statistics.median(slowed), 3) if slowed else 0.0,
            "rows": len(slowed),
            "beyond_20_percent": sum(abs(e) > 0.2 for e in slowed),
        },
    }


def cpu_errors(path: Path = CPU_ROWS) -> list[float]:
    with open(path) as fh:
        return [float(r["predicted_s"]) / float(r["measured_s"]) - 1 for r in csv.DictReader(fh)]


def cpu_rows(folder: Path) -> list[dict[str, Any]]:
    """Every strategy `recommend --validate` measured (*-validate*.json in `folder`, with the
    recommendation's profiles and the machine's probe beside them), re-predicted."""
    from pipecast.planning.recommend.predict import predict
    from pipecast.values.strategy import Strategy

    cluster = Cluster.load(str(folder / "cluster.json"))
    out = []
    for path in sorted(folder.glob("*-validate*.json")):
        doc = json.loads(path.read_text())
        profile = Profile.load(str(folder / f"profile_{doc['workload']['model']}.json"))
        strategies = {r["label"]: Strategy.from_dict(r["strategy"]) for r in doc["ranked"]}
        for v in doc["validation"]:
            pred = predict(
                profile, cluster, strategies[v["label"]], doc["batch"], optimizer=doc["optimizer"]
            )
            out.append(
                {
                    "recommendation": path.stem,
                    "label": v["label"],
                    "predicted_s": pred.step_time,
                    "measured_s": v["measured"],
                }
            )
    return out


# ---- per run ---------------------------------------------------------------------------


def summary_lines(rows: list[tuple[str, Comparison]]) -> list[str]:
    """A Markdown table: per run, eager rows, median and worst |error|, within 20%, worst
    memory error, picks right."""
    lines = [
        "| run | rows | median | worst | within 20% | memory worst | picks |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in dict.fromkeys(r for r, _ in rows):
        comps = [c for r, c in rows if r == run and not c.graphed]
        if not comps:
            continue
        errors = [abs(c.error) for c in comps]
        mems = [abs(e) for c in comps if (e := c.memory_error) is not None]
        picks = decisions(comps)
        lines.append(
            f"| {run} | {len(comps)} | {statistics.median(errors):.1%} | {max(errors):.1%} | "
            f"{sum(e <= 0.2 for e in errors)} | {max(mems):.1%} | "
            f"{sum(d.slowdown == 0 for d in picks)}/{len(picks)} |"
            if mems
            else f"| {run} | {len(comps)} | {statistics.median(errors):.1%} | "
            f"{max(errors):.1%} | {sum(e <= 0.2 for e in errors)} | - | "
            f"{sum(d.slowdown == 0 for d in picks)}/{len(picks)} |"
        )
    return lines


def runtime_rows(traces_json: Path, kind: str) -> list[tuple[str, float, float]]:
    """(label, measured, predicted) for each pipecast configuration of a runtime call
    (benchmarks/traces.py's traces.json), predicted from the profiles pipecast ships for
    `kind` and its NVLink preset, as `recommend --cluster` predicts without the GPUs."""
    from benchmarks import traces

    named = {
        name: cfg
        for make in traces.SETS.values()
        for name, cfg, _ in make()
        if cfg.system == "pipecast"
    }
    profiles = {Workload.from_dict(p.workload).key: p for p in shipped(kind)}
    out = []
    for row in json.loads(traces_json.read_text()):
        cfg = named.get(row["name"])
        if cfg is None or row["rank"] != 0 or row["error"]:
            continue
        cluster = PRESETS[f"{kind}-nvlink"].subset(cfg.gpus)
        predicted = predictions([cfg], profiles, cluster).get(cfg.key)
        if predicted:
            out.append((cfg.label(), row["step_ms"] / 1e3, predicted["step_time"]))
    return out


def _write_csv(path: Path, fields: list[str], rows: list[dict[str, Any]], append: bool) -> None:
    new = not (append and path.exists())
    with open(path, "w" if new else "a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        if new:
            writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("rows", help="re-predict GPU run folders into a CSV")
    p.add_argument("--run", action="append", required=True, type=Path)
    p.add_argument("--out", type=Path, default=ROWS)
    p.add_argument("--append", action="store_true", help="add to the CSV rather than replace")
    p = sub.add_parser("cpu-rows", help="re-predict CPU validations into a CSV")
    p.add_argument("--validate", type=Path, required=True)
    p.add_argument("--out", type=Path, default=CPU_ROWS)
    p = sub.add_parser("bands", help="the error ranges recommend quotes")
    p.add_argument("--rows", type=Path, default=ROWS)
    p.add_argument("--cpu-rows", type=Path, default=CPU_ROWS)
    p.add_argument("--write", type=Path, help="write them here (JSON) as well as print them")
    p = sub.add_parser("runtime", help="a runtime call's rows predicted without the GPUs")
    p.add_argument("--traces", type=Path, required=True)
    p.add_argument("--kind", default="h200", choices=("h100", "h200"))
    p = sub.add_parser("summary", help="per run: errors, memory, picks")
    p.add_argument("--rows", type=Path, default=ROWS)
    p.add_argument("--shipped", action="store_true", help="from the shipped profiles")
    args = parser.parse_args(argv)
    if args.cmd == "rows":
        first = not args.append
        for run in args.run:
            rows = run_rows(run)
            _write_csv(args.out, FIELDS, rows, append=not first)
            first = False
            print(f"{run.name}: {len(rows)} rows", flush=True)
    elif args.cmd == "cpu-rows":
        rows = cpu_rows(args.validate)
        _write_csv(args.out, CPU_FIELDS, rows, append=False)
        print(f"{len(rows)} rows")
    elif args.cmd == "bands":
        doc = bands(load_rows(args.rows), cpu_errors(args.cpu_rows))
        text = json.dumps(doc, indent=1) + "\n"
        if args.write:
            args.write.write_text(text)
        sys.stdout.write(text)
    elif args.cmd == "runtime":
        found = runtime_rows(args.traces, args.kind)
        print("| configuration | measured | predicted | error |\n|---|---|---|---|")
        for label, measured, predicted in found:
            print(
                f"| {label} | {measured * 1e3:.2f} ms | {predicted * 1e3:.2f} ms | "
                f"{predicted / measured - 1:+.1%} |"
            )
        errors = [abs(p / m - 1) for _, m, p in found]
        if errors:
            print(
                f"\n{len(errors)} rows: median {statistics.median(errors):.1%}, worst "
                f"{max(errors):.1%}, {sum(e <= 0.2 for e in errors)} within 20%"
            )
    else:
        print("\n".join(summary_lines(load_rows(args.rows, shipped_path=args.shipped))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
