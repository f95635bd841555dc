"""Build the committed store and report from GPU run directories, with every prediction
recomputed by this checkout's code from the profiles and probe measured in the same run.

    cd benchmarks && python3 combine.py --comparison results/h200x4-run3/anchors.sqlite \
        --comparison-suite anchors-final --run results/h200x4-run7 --run results/h200x4-run8 \
        --run results/h200x4-run10 --run results/h200x2-run1 --run results/h200x2-run2 \
        --run results/h200x2-run3 --run results/h200x4-run9 --run results/h200x4-run11 \
        --run results/h100x4-run1 \
        --run results/h100x4-run2 --run results/h100x4-run3 --run results/h100x4-run4 \
        --run results/h100x4-run5 --run results/h100x4-run6 --run results/h100x4-run7 \
        --run results/h100x4-run8 --run results/h100x4-run9 --run results/h100x4-run10 \
        --run results/h100x4-run11 --run results/h100x2-graphs-run1 \
        --run results/h100x2-graphs-run2 --run results/h100x4-run12 \
        --run results/h200x4-graphs-run1 --run results/h100x4-graphs-run1 \
        --run results/h100x4-graphs-run2 --run results/h200x4-run12 \
        --run results/h100x4-run13 --run results/h100x4-run14 \
        --run results/h100x4-run15 --run results/h100x4-run16 --run results/h200x4-run13 \
        --run results/h100x4-run17 --run results/h200x4-run14 \
        --run results/h100x4-run18 --run results/h100x4-run19 --run results/h100x4-run20 \
        --run results/h100x4-run21 --run results/h100x4-run22 --run results/h200x4-run15 \
        --run results/h200x4-run16 --run results/h200x4-run17 --run results/h200x2-run4 \
        --out results/combined.sqlite --report results/report --summaries results/summaries.json

Rows of the comparison store (pipecast against torch.distributed.pipelining) are copied as
they are; rows of the run get fresh predictions. Runs may be repeated: the accuracy summary of
each is printed, predicted by the same code.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import statistics
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import common  # noqa: F401  (puts src/ on the path)

from pipecast.bench.accuracy import comparisons, summary
from pipecast.bench.config import BenchConfig
from pipecast.bench.predictions import predictions
from pipecast.bench.store import Row, Store
from pipecast.hardware.cluster import DDP_PARAM_HOST, Cluster
from pipecast.models.workload import Workload
from pipecast.profile.types import Profile
from pipecast.report.html import build


def run_profiles(run: Path, prefix: str = "profile_") -> dict[str, Profile]:
    """The run's profiles named `prefix`*.json, by workload key."""
    out = {}
    for path in sorted(glob.glob(str(run / f"{prefix}*.json"))):
        if path.endswith("profile_bars.json"):
            continue
        profile = Profile.load(path)
        if profile.workload:
            workload = Workload.from_dict(profile.workload)
            if not profile.target_bytes_per_sample:  # profiled before the profiler kept it
                itemsize = profile.input_bytes_per_sample // math.prod(workload.spec.sample_shape)
                target = workload.spec.target_bytes(itemsize)
                profile = replace(profile, target_bytes_per_sample=target)
            out[workload.key] = profile
    call = split_call_estimate(out.values())
    return {
        k: replace(p, host_split_call=call) if p.host_split_call == 0.0 else p
        for k, p in out.items()
    }


def split_call_estimate(profiles: Iterable[Profile]) -> float:
    """A B call's own host cost, for runs profiled before the profiler measured it: a
    weightless block's lone B less its forward (each issues one kernel for one autograd
    node): the median over such blocks of all the run's profiles, the least over sizes
    (zero without such blocks)."""
    gaps: dict[int, list[float]] = {}
    for profile in profiles:
        for b in profile.blocks[1:]:
            for mb, c in b.costs.items() if b.params == 0 else ():
                gaps.setdefault(mb, []).append(c.host_backward_input - c.host_forward)
    medians = [statistics.median(g) for g in gaps.values()]
    return max(min(medians), 0.0) if medians else 0.0


def as_probed_now(cluster: Cluster) -> Cluster:
    """A stored probe as this checkout's probe writes it: DDP's host cost per parameter
    tensor fixed (cluster.DDP_PARAM_HOST) where the probe read DDP's costs at all."""
    if cluster.ddp_step_host == 0.0 and cluster.ddp_param_host == 0.0:
        return cluster
    return replace(cluster, ddp_param_host=DDP_PARAM_HOST)


def repredicted(
    run: Path, profiles: dict[str, Profile] | None = None, cluster: Cluster | None = None
) -> list[Row]:
    """The rows of `run` with every prediction made afresh from `profiles` and `cluster`
    (default: the run's own)."""
    rows = list(Store(run / "bench.sqlite").rows())
    configs = [BenchConfig.from_dict(r.config) for r in rows]
    predicted = predictions(
        configs,
        run_profiles(run) if profiles is None else profiles,
        cluster or as_probed_now(Cluster.load(str(run / "cluster.json"))),
    )
    return [
        replace(r, predicted=predicted.get(cfg.key, r.predicted))
        for r, cfg in zip(rows, configs, strict=True)
    ]


def repredict(run: Path, into: Store | None) -> dict[str, float | int]:
    """Predict every configuration of `run` afresh; copy the rows into `into`."""
    fresh = repredicted(run)
    for row in fresh:
        if into is not None:
            into.put(
                row.key,
                row.suite,
                row.status,
                row.config,
                row.environment,
                row.measured,
                row.predicted,
                row.error,
            )
    return summary(comparisons(fresh))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--comparison", help="store whose rows are copied unchanged")
    ap.add_argument("--comparison-suite", help="copy only this suite of it")
    ap.add_argument("--run", action="append", default=[], help="GPU run directory")
    ap.add_argument("--out", help="combined store (the last --run's rows)")
    ap.add_argument("--report", help="render the combined store's report here")
    ap.add_argument("--summaries", help="write every run's accuracy summary here (JSON)")
    args = ap.parse_args()
    out = None
    if args.out:
        Path(args.out).unlink(missing_ok=True)
        out = Store(args.out)
        if args.comparison:
            for r in Store(args.comparison).rows(suite=args.comparison_suite):
                out.put(r.key, r.suite, r.status, r.config, r.environment, r.measured, None)
    summaries = {}
    for i, run in enumerate(args.run):
        last = i == len(args.run) - 1
        s = summaries[Path(run).name] = repredict(Path(run), out if last else None)
        print(
            f"{run}: {s['configurations']} configurations, median |error| "
            f"{s['median_abs_error']:.1%}, worst {s['worst_abs_error']:.1%}, "
            f"{s['within_7_percent']} within 7%, {s['within_20_percent']} within 20%; "
            f"device-bound {s.get('device_bound_configurations', 0)}: median "
            f"{s.get('device_bound_median_abs_error', float('nan')):.1%}, worst "
            f"{s.get('device_bound_worst_abs_error', float('nan')):.1%}; host-bound "
            f"{s.get('host_bound_configurations', 0)}: median "
            f"{s.get('host_bound_median_abs_error', float('nan')):.1%}, worst "
            f"{s.get('host_bound_worst_abs_error', float('nan')):.1%}; memory median "
            f"{s['median_abs_memory_error']:.1%}, worst {s['worst_abs_memory_error']:.1%}; "
            f"decisions {s['right']}/{s['decisions']} right, "
            f"{s['within_5_percent']} within 5%"
        )
        if "graphed_configurations" in s:
            print(
                f"  CUDA-graphed {s['graphed_configurations']}: median "
                f"{s['graphed_median_abs_error']:.1%}, worst {s['graphed_worst_abs_error']:.1%}, "
                f"{s['graphed_within_7_percent']} within 7%, {s['graphed_within_20_percent']} "
                f"within 20%; memory median {s['graphed_median_abs_memory_error']:.1%}, worst "
                f"{s['graphed_worst_abs_memory_error']:.1%}; picks among eager and graphed "
                f"{s['right_with_graphs']}/{s['decisions_with_graphs']} right"
            )
        if "round_spread_median" in s:
            print(
                f"  rounds moved by a median {s['round_spread_median']:.1%}, at most "
                f"{s['round_spread_worst']:.1%}; {s['repeatable_configurations']} repeatable "
                f"(rounds within 10%): median {s['repeatable_median_abs_error']:.1%}, worst "
                f"{s['repeatable_worst_abs_error']:.1%}, "
                f"{s['repeatable_within_20_percent']} within 20%"
            )
        if "host_drift_median" in s:
            print(
                f"  host-bound at the host speed each ran at (median slowdown "
                f"{s['host_drift_median']:.2f}x vs profiling): median "
                f"{s['host_bound_median_abs_error_at_run_host_speed']:.1%}"
            )
    if args.summaries:
        Path(args.summaries).write_text(json.dumps(summaries, indent=1, sort_keys=True) + "\n")
    if args.report and args.out and args.run:
        run = Path(args.run[-1])
        profiles = [str(run / f"profile_{n}.json") for n in ("vgg16", "gpt", "resnet50")]
        build(
            args.out,
            args.report,
            profiles=[p for p in profiles if Path(p).exists()],
            probe=str(run / "probe_raw.json"),
            cluster=Cluster.load(str(run / "cluster.json")),
        )


if __name__ == "__main__":
    main()
