"""Run a benchmark suite into a folder, then write its report.

    python -m benchmarks.run runtime --out /tmp/rt            # 2 GPUs (--gpus N for more)
    python -m benchmarks.run accuracy --out /tmp/acc --rounds 5 --budget 540
    python -m benchmarks.run anchors --out /tmp/anchors       # 4 GPUs
    python -m benchmarks.run quick --out /tmp/quick           # CPU ranks, minutes
    python -m benchmarks.run accuracy --dry-run --out /tmp/dry   # the accuracy flow on CPU
    python -m benchmarks.run offload --gpus 4 --out /tmp/off  # GPT planned for small GPUs

The folder gets bench.sqlite (every configuration as it completes: a rerun with the same
--out resumes), environment.json, and for `accuracy` the probe (cluster.json) and the
profiles (profile_<name>.json) the predictions come from; then report.md (the suite's table
and verdict, benchmarks/report.py). Copy that report to
benchmarks/reports/<date>_<hardware>_<suite>_<commit>.md and add its line to results/index.csv
with `python -m benchmarks.report --store DIR/bench.sqlite --commit`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from benchmarks import report, thesis
from benchmarks.study_systems import SYSTEMS, studies
from pipecast.measuring.probe.probe import ProbeOptions, probe
from pipecast.measuring.profiler.profiler import ProfileOptions, profile_model
from pipecast.orchestration.bench import accuracy_suite, offload_suite
from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.predictions import predictions
from pipecast.orchestration.bench.runner import run_suite
from pipecast.orchestration.bench.suites import anchors as anchor_suite
from pipecast.orchestration.bench.suites import quick, runtime
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.models.workload import Workload
from pipecast.values.profile.reference import reference_profile
from pipecast.values.profile.types import Profile

TINY_GPT = Workload(
    model="transformer", dataset="embeddings", seq_len=16, width=32, layers=8, heads=4
)
TINY_VGG = Workload(model="vgg11", dataset="cifar10")

SUITES = ("runtime", "accuracy", "anchors", "quick", "studies", "thesis", "offload")


def _profiles(
    out: Path, dry: bool, items: list[accuracy_suite.Profiled], deadline: float, **quick: Any
) -> dict[str, Profile]:
    """A suite's profiles, each saved as it is taken: a rerun with the same --out keeps
    them, and one past its `deadline` (time.time(); 0: none) stops between two, to resume
    there."""
    device, dtype = ("cpu", "fp32") if dry else ("cuda", "bf16")
    found = {}
    for done, item in enumerate(items):
        path = out / f"profile_{item.name}.json"
        if path.exists():  # written whole (Profile.save), so complete
            found[item.workload.key] = Profile.load(str(path))
            continue
        if deadline and time.time() > deadline:
            raise SystemExit(
                f"out of --budget while profiling: {done} of {len(items)} profiles are in "
                f"{out}; run the same command again to go on from there"
            )
        began = time.time()
        options = ProfileOptions(micro_batch_sizes=item.sizes, device=device, dtype=dtype, **quick)  # type: ignore[arg-type]
        prof = profile_model(
            item.workload.build(),
            item.workload.spec,
            options,
            model_name=item.workload.model,
            workload=item.workload.to_dict(),
        )
        prof.save(str(path))
        found[item.workload.key] = prof
        print(f"profiled {item.name} at {item.sizes} in {time.time() - began:.0f} s", flush=True)
    return found


def _cluster(out: Path, gpus: int, dry: bool) -> Cluster:
    path = out / "cluster.json"
    if path.exists():  # written whole (Cluster.save)
        return Cluster.load(str(path))
    options = ProbeOptions(
        devices=gpus,
        device="cpu" if dry else "cuda",
        max_bytes=2**20 if dry else 256 * 2**20,
        matmul_size=256 if dry else 0,
    )
    cluster = probe(options).cluster
    cluster.save(str(path))
    return cluster


def configurations(
    suite: str, out: Path, gpus: int, dry: bool, deadline: float = 0.0
) -> tuple[list[BenchConfig], dict[str, dict[str, object]]]:
    """The suite's configurations and, where it predicts, their predictions (from profiles
    taken until `deadline`, see _profiles)."""
    if suite == "quick":
        return quick(), {}
    if suite == "anchors":
        return anchor_suite(gpus=gpus), {}
    if suite == "runtime":
        return runtime(gpus), {}
    if suite == "studies":
        if dry:
            return [replace(c, device="cpu", dtype="fp32", steps=2, warmup=1, cuda_graphs=False)
                    for c in studies(2, gpt=TINY_GPT, vgg=TINY_VGG)], {}  # fmt: skip
        return studies(gpus), {}
    cluster = _cluster(out, gpus, dry)
    if suite == "thesis":
        items = [
            accuracy_suite.Profiled(f"{w.model}_{w.dataset}", w, sizes)
            for w, sizes in thesis.workloads(gpus, dry)
        ]
        # the cells run eager: no graph times; fewer repeats, as the cells are many
        profiles = _profiles(out, dry, items, deadline, repeats=3, graph_times=False)
        configs = thesis.configurations(profiles, cluster, gpus, dry=dry)
        predicted: dict[str, dict[str, object]] = predictions(configs, profiles, cluster)  # type: ignore[assignment]
        for c in configs:  # the thesis's equations beside the simulator
            eq = thesis.equations(c, profiles[c.workload.key], cluster)
            if eq is not None and c.key in predicted:
                predicted[c.key]["thesis_step_time"] = eq
        return configs, predicted
    if suite == "offload":
        return _offload(out, cluster, gpus, dry, deadline)
    profiles = _profiles(out, dry, accuracy_suite.workloads(dry), deadline)
    configs = accuracy_suite.configurations(profiles, cluster, gpus, dry=dry)
    return configs, predictions(configs, profiles, cluster)  # type: ignore[return-value]


def _offload(
    out: Path, cluster: Cluster, gpus: int, dry: bool, deadline: float
) -> tuple[list[BenchConfig], dict[str, dict[str, object]]]:
    """The offload suite planned from pipecast's own profile of the GPT stack on this GPU
    kind where it ships one (else one taken here) and this machine's probe."""
    gpt = TINY_GPT if dry else offload_suite.GPT
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    prof = None if dry else reference_profile(gpt, "bf16", name)
    if prof is None:
        item = accuracy_suite.Profiled("gpt", gpt, (1, 2) if dry else (1, 2, 4, 8))
        prof = _profiles(out, dry, [item], deadline)[gpt.key]
    limits = offload_suite.dry_limits(prof, cluster, gpus) if dry else offload_suite.LIMITS
    configs = offload_suite.configurations(
        prof, cluster, gpus, workload=gpt, limits=limits, dry=dry
    )
    return configs, predictions(configs, {gpt.key: prof}, cluster)  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite", choices=SUITES)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gpus", type=int, default=0, help="default: every GPU here (2 dry)")
    parser.add_argument("--rounds", type=int, default=1, help="measure the suite N times over")
    parser.add_argument("--budget", type=float, default=0.0, help="seconds; 0: no limit")
    parser.add_argument("--dry-run", action="store_true", help="CPU ranks, tiny workloads")
    parser.add_argument("--skip", default="", help="leave out configurations whose label matches")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.gpus < 0 or args.budget < 0:
        parser.error("--rounds must be at least 1, --gpus and --budget at least 0")
    began = time.time()
    dry = args.dry_run or args.suite == "quick"
    gpus = args.gpus or (2 if dry else torch.cuda.device_count())
    if not dry and gpus < 1:
        parser.error("this suite needs GPUs: none here (use --dry-run)")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    names = [torch.cuda.get_device_name(i) for i in range(gpus)] if not dry else ["cpu"]
    env = {"torch": torch.__version__, "gpus": gpus, "names": names, "suite": args.suite}
    (out / "environment.json").write_text(json.dumps(env, indent=1) + "\n")
    deadline = began + args.budget if args.budget else 0.0
    configs, predicted = configurations(args.suite, out, gpus, dry, deadline)
    configs = [c for c in configs if c.gpus <= gpus]
    if args.skip:
        configs = [c for c in configs if not re.search(args.skip, c.label())]
    print(f"{len(configs)} configurations on {gpus} x {names[0]}", flush=True)
    run_suite(
        configs,
        str(out / "bench.sqlite"),
        predicted=predicted,  # type: ignore[arg-type]
        timeout_s=150,
        deadline=deadline or None,
        rounds=args.rounds,
        systems=SYSTEMS,
    )
    (out / "report.md").write_text(report.render(out / "bench.sqlite", suite=args.suite))
    print(f"report: {out / 'report.md'} ({time.time() - began:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
