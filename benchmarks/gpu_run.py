"""GPU benchmark run: probe the machine, profile (issue 3's bars), then, in one launch per GPU
count, pipecast against torch.distributed.pipelining, DDP and one device on the anchor
workloads (issue 6), the recommender's accuracy configurations on 1/2/4 GPUs (issue 7), the
GPipe study's splits x micro-batches and part of the thesis's data- against pipeline-parallel
comparison (issue 8). Every result goes to a SQLite store as it completes.

    OUT=/tmp/run python3 benchmarks/gpu_run.py --budget 500     (every file also in all.tgz)
    OUT=/tmp/run PACK_TO=$OUT python3 ...   # all.tgz also into the device's $OUT, after the
                                            # probe, each profile and at the end
    python3 benchmarks/gpu_run.py --dry-run      # the same flow, tiny, on CPU ranks
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterable
from dataclasses import replace

import torch
from common import OUT, dump, left, log, pack
from machine_state import core_loops, core_summary, loop_change, loop_pair, record, steal_share

from pipecast.bench.config import BenchConfig
from pipecast.bench.predictions import predictions
from pipecast.bench.runner import run_suite
from pipecast.bench.suites import GPT, VGG16, anchors, gpipe_study
from pipecast.hardware import devices
from pipecast.hardware.cluster import Cluster
from pipecast.hardware.probe import ProbeOptions, probe
from pipecast.models.workload import Workload
from pipecast.partition import Setting, partition
from pipecast.profile.profiler import ProfileOptions, measure_step, profile_model
from pipecast.profile.types import Profile
from pipecast.runtime import graphs


def profile(
    name: str,
    workload: Workload,
    sizes: tuple[int, ...],
    *,
    device: str,
    dtype: str,
    plain: bool = False,
) -> Profile:
    """`name`'s profile at `sizes` (plain: device times from plain passes, without
    ProfileOptions.hide_issue, as profiles were taken up to h100x4-run10; saved apart as
    plain_profile_*.json)."""
    path = OUT / f"{'plain_' if plain else ''}profile_{name}.json"
    if RESUME and path.exists():  # a run continued on the same machine keeps its profiles
        log(f"profile {name}: reused {path.name}")
        return Profile.load(str(path))
    began = time.time()
    prof = profile_model(
        workload.build(),
        workload.spec,
        ProfileOptions(micro_batches=sizes, device=device, dtype=dtype, hide_issue=not plain),  # type: ignore[arg-type]
        model_name=workload.model,
        workload=workload.to_dict(),
    )
    prof.save(str(path))
    graphed = "graph times" if prof.graph_times else f"no graph times {prof.graph_failure}"
    log(f"{path.stem} at {sizes}: {time.time() - began:.1f} s, {graphed}")
    pair = loop_pair()  # the profiling process's loop against a new interpreter's
    cores = core_loops(passes=1)  # and on each CPU: slow CPUs, or a slow host?
    with open(OUT / "loop_pairs.jsonl", "a") as fh:
        fh.write(json.dumps({"after": path.stem, "time": time.time(), **pair, "cores": cores}))
        fh.write("\n")
    new = f"{pair['new_s'] * 1e3:.1f}" if pair["new_s"] is not None else "-"
    log(f"pure-Python loop after {path.stem}, ms: here {pair['here_s'] * 1e3:.1f}, new {new}")
    log(f"  pinned to each CPU: {core_summary(cores)}")
    pack()  # a profile takes up to minutes: a call cut off later keeps it
    if device == "cuda":
        torch.cuda.empty_cache()
    return prof


def profile_bar(
    name: str, workload: Workload, prof: Profile, check: int, *, device: str, dtype: str
) -> dict[str, object]:
    """The per-block sum at `check` against a whole-model step, and a second profile."""
    again = profile_model(
        workload.build(),
        workload.spec,
        ProfileOptions(micro_batches=(check,), device=device, dtype=dtype),  # type: ignore[arg-type]
        model_name=workload.model,
    )
    whole, whole2 = prof.stage(0, prof.num_blocks, check), again.stage(0, again.num_blocks, check)
    block_sum = whole.forward + whole.backward
    step = measure_step(
        workload.build(),
        workload.spec,
        check,
        ProfileOptions(device=device, dtype=dtype, warmup=3, repeats=9),
    )  # type: ignore[arg-type]
    bar = {
        "micro_batch": check,
        "sum_of_blocks_s": block_sum,
        "whole_step_s": step,
        "ratio": block_sum / step,
        "second_profile_sum_s": whole2.forward + whole2.backward,
        "profile_agreement": (whole2.forward + whole2.backward) / block_sum,
        "device": prof.device,
    }
    log(
        f"bar {name}: blocks {block_sum * 1e3:.2f} ms vs step {step * 1e3:.2f} ms (ratio "
        f"{bar['ratio']:.3f}), second profile {bar['profile_agreement']:.3f}"
    )
    if device == "cuda":
        torch.cuda.empty_cache()
    return bar


def balanced(prof: Profile, cluster: Cluster, stages: int, mb: int, m: int) -> tuple[int, ...]:
    setting = Setting(micro_batch=mb, microbatches=m, schedule="1f1b", memory_margin=0.1)
    return tuple(partition(prof, cluster, stages, setting, "balanced").boundaries)


def probe_options(gpus: int, dry: bool) -> ProbeOptions:
    """The probe of every run: links up to 256 MiB, the matmul at its default size (a dry
    run: CPU ranks, tiny sizes)."""
    return ProbeOptions(
        devices=gpus,
        device="cpu" if dry else "cuda",
        repeats=5,
        max_bytes=2**20 if dry else 256 * 2**20,
        matmul_size=256 if dry else 0,
    )


RESUME = False
STATE: dict[str, object] | None = None  # the machine's state as this call began


def host_bound_first(names: Iterable[str]) -> list[str]:
    """`names` with the models whose small micro-batches bind their host first."""
    first = ("vgg16_cifar", "resnet18", "mobilenetv2", "resnet50")
    names = list(names)
    return [*(n for n in first if n in names), *(n for n in names if n not in first)]


def main() -> None:
    global RESUME
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=500.0)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--no-torch", action="store_true", help="skip torch.distributed.pipelining")
    ap.add_argument(
        "--accuracy-only",
        action="store_true",
        help="skip issue 3's profiling bars (sum of blocks against a step, ResNet-152 time)",
    )
    ap.add_argument(
        "--gpus",
        type=int,
        default=0,
        help="use this many devices (default: all; configurations needing more are skipped)",
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="continue a run in the same OUT on the same machine: reuse its probe and "
        "profiles, skip the configurations already measured",
    )
    ap.add_argument(
        "--late-profiles",
        action="store_true",
        help="after the suite, profile every model again at its smallest size "
        "(late_profile_*.json): how far its host costs moved over the run",
    )
    ap.add_argument(
        "--plain-profiles",
        action="store_true",
        help="after the suite, profile every model again with device times from plain "
        "passes, the host's issuing not hidden (plain_profile_*.json; hidden_issue.py "
        "compares)",
    )
    ap.add_argument(
        "--graphs",
        action="store_true",
        help="add a CUDA-graphed twin of every pipecast configuration the runtime can graph "
        "(whole backward, no recomputation), predicted with the graphed model",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="measure the suite this many times over; each configuration keeps its median",
    )
    args = ap.parse_args()
    RESUME = args.resume
    dry = args.dry_run
    if dry and args.graphs:  # CPU ranks and the profiler play the graphs with their stand-in
        os.environ[graphs.STAND_IN_ENV] = "1"
    device, dtype = ("cpu", "fp32") if dry else ("cuda", "bf16")
    gpus = args.gpus or (2 if dry else torch.cuda.device_count())
    names = [torch.cuda.get_device_name(i) for i in range(gpus)] if not dry else ["cpu"]
    local = (
        [len(devices.local_cpus(torch.device("cuda", i))) for i in range(gpus)] if not dry else []
    )
    dump(
        "environment.json",
        {"torch": torch.__version__, "gpus": gpus, "names": names, "numa_local_cpus": local},
    )
    log(f"CPUs on each GPU's NUMA node (ranks are pinned there): {local}")
    log(f"torch {torch.__version__}, {gpus} x {names[0]}")
    global STATE
    STATE = record(OUT, "start", readings=not dry)
    log(f"machine state at start: {STATE['clock_mhz']}, load {STATE['loadavg']}")
    if "core_loop_s" in STATE:
        log(f"pure-Python loop pinned to each CPU: {core_summary(STATE['core_loop_s'])}")

    if RESUME and (OUT / "cluster.json").exists():
        cluster = Cluster.load(str(OUT / "cluster.json"))
        log("probe: reused cluster.json")
    else:
        result = probe(probe_options(gpus, dry))
        cluster = result.cluster
        cluster.save(str(OUT / "cluster.json"))
        dump("probe_raw.json", result.to_dict())
        pack()
    # partitions for configurations wider than this machine are still planned (then skipped)
    plan_cluster = replace(cluster, gpus_per_node=max(cluster.gpus_per_node, 4))
    busbw = {n: round(b / 1e9, 1) for n, b in cluster.allreduce_busbw.items()}
    log(
        f"probe: p2p {cluster.intra.bandwidth / 1e9:.1f} GB/s {cluster.intra.latency * 1e6:.1f} "
        f"us, all-reduce bus GB/s {busbw}, matmul {cluster.matmul_flops / 1e12:.0f} TFLOP/s, "
        f"runtime host overhead {cluster.host_overhead * 1e6:.0f} us/action"
    )

    if dry:
        gpt = Workload(
            model="transformer", dataset="embeddings", seq_len=16, width=32, layers=8, heads=4
        )
        vgg = Workload(model="vgg11", dataset="cifar10")
        r50 = Workload(model="resnet18", dataset="cifar10")
        vggc = Workload(model="lenet5", dataset="mnist")
        thesis: list[Workload] = [Workload(model="mobilenetv2", dataset="cifar10")]
        gpt_sizes, vgg_sizes, r50_sizes, gb, vb, rb, wide = (1, 2), (2, 4), (2, 4, 8), 16, 16, 16, 2
    else:
        gpt, vgg, r50 = GPT, VGG16, Workload(model="resnet50", dataset="imagenet")
        vggc = Workload(model="vgg16", dataset="cifar10")
        thesis = [
            Workload(model=m, dataset="imagenet") for m in ("resnet18", "resnet152", "mobilenetv2")
        ]
        gpt_sizes, vgg_sizes, r50_sizes = (1, 2, 4, 8), (4, 8, 16, 32, 64, 128), (16, 32, 64, 128)
        # the widest data-parallel and pipeline configurations use every GPU, up to 4
        gb, vb, rb, wide = 32, 128, 128, min(4, gpus)

    profiles: dict[str, Profile] = {}
    bars: dict[str, object] = {}
    vgg_p = profiles[vgg.key] = profile("vgg16", vgg, vgg_sizes, device=device, dtype=dtype)
    gpt_p = profiles[gpt.key] = profile("gpt", gpt, gpt_sizes, device=device, dtype=dtype)
    if not args.accuracy_only:  # issue 3's profiling bars
        bars["vgg16"] = profile_bar(
            "vgg16", vgg, vgg_p, vgg_sizes[-1] if dry else 32, device=device, dtype=dtype
        )
        bars["gpt"] = profile_bar("gpt", gpt, gpt_p, gpt_sizes[-2], device=device, dtype=dtype)
    if not dry and not args.accuracy_only:
        began = time.time()
        profile(
            "resnet152_bar",
            Workload(model="resnet152", dataset="imagenet"),
            (8, 16, 32),
            device=device,
            dtype=dtype,
        )
        bars["resnet152_profile_seconds"] = time.time() - began
    if bars:
        dump("profile_bars.json", bars)
    r50_p = profiles[r50.key] = profile("resnet50", r50, r50_sizes, device=device, dtype=dtype)
    vggc_p = profiles[vggc.key] = profile(
        "vgg16_cifar", vggc, (4, 8, 32, 128) if not dry else (2, 8), device=device, dtype=dtype
    )
    for w in thesis:
        profiles[w.key] = profile(
            w.model, w, (32, 64, 128) if not dry else (4, 8), device=device, dtype=dtype
        )
    profiled = {  # name -> workload and sizes, for --late-profiles
        name: (w, profiles[w.key].micro_batches)
        for name, w in [
            ("vgg16", vgg),
            ("gpt", gpt),
            ("resnet50", r50),
            ("vgg16_cifar", vggc),
            *((w.model, w) for w in thesis),
        ]
    }

    # --- configurations, most important first -------------------------------------------
    if dry:
        anchor = anchors(
            (0, 4, 8),
            (0, 2, 4, 6, 8),
            (0, 15, 30),
            None,
            gpus=2,
            gpt=gpt,
            vgg=vgg,
            gpt_batch=gb,
            vgg_batch=vb,
        )
    else:
        anchor = anchors(vgg_pipecast=balanced(vgg_p, plan_cluster, 4, 16, 8))
    extra: list[BenchConfig] = []
    base = BenchConfig(suite="accuracy", system="single", workload=r50, gpus=1, batch=rb)
    for k in (2, wide):
        extra.append(replace(base, system="ddp", gpus=k))
        for m in (k, 2 * k):
            split = balanced(r50_p, plan_cluster, k, rb // m, m)
            extra.append(
                replace(
                    base,
                    system="pipecast",
                    gpus=k,
                    schedule="1f1b",
                    microbatches=m,
                    boundaries=split,
                    tags={"split": "pipecast"},
                )
            )
        extra.append(
            replace(
                base,
                system="pipecast",
                gpus=k,
                schedule="zb-h1",
                microbatches=2 * k,
                boundaries=balanced(r50_p, plan_cluster, k, rb // (2 * k), 2 * k),
                tags={"split": "pipecast"},
            )
        )
    half = balanced(r50_p, plan_cluster, wide // 2, rb // 4, 2)
    extra.append(
        replace(
            base,
            system="pipecast",
            gpus=wide,
            replicas=2,
            schedule="1f1b",
            microbatches=2,
            boundaries=half,
            tags={"split": "pipecast"},
        )
    )
    g2 = BenchConfig(suite="accuracy", system="ddp", workload=gpt, gpus=2, batch=gb)
    gsplit = (0, gpt_p.num_blocks // 2, gpt_p.num_blocks)
    extra += [
        g2,
        replace(g2, system="pipecast", schedule="1f1b", microbatches=8, boundaries=gsplit),
        replace(g2, system="pipecast", schedule="zb-h1", microbatches=8, boundaries=gsplit),
    ]
    v2 = BenchConfig(suite="accuracy", system="ddp", workload=vgg, gpus=2, batch=vb)
    extra += [
        v2,
        replace(
            v2,
            system="pipecast",
            schedule="1f1b",
            microbatches=8,
            boundaries=balanced(vgg_p, plan_cluster, 2, vb // 8, 8),
        ),
    ]
    extra.append(base)
    seeds = gpipe_study(
        vggc,
        {
            1: (0, vggc_p.num_blocks),
            2: balanced(vggc_p, plan_cluster, 2, 16, 8),
            wide: balanced(vggc_p, plan_cluster, wide, 16, 8),
        },
        128 if not dry else 16,
        microbatches=(1, 4, 16, 32) if not dry else (1, 4),
    )
    thesis_cfgs: list[BenchConfig] = []
    for w in thesis:
        t = BenchConfig(
            suite="seeds",
            system="single",
            workload=w,
            gpus=1,
            batch=128 if not dry else 16,
            tags={"study": "thesis"},
        )
        split = balanced(profiles[w.key], plan_cluster, wide, 32 if not dry else 4, 4)
        thesis_cfgs += [
            replace(t, system="ddp", gpus=wide),
            replace(
                t, system="pipecast", gpus=wide, schedule="1f1b", microbatches=4, boundaries=split
            ),
            t,
        ]
    # the split backward as one graph per stage, beside the same runs cut into segments
    uncut = [
        replace(c, cut_backward=False)
        for c in anchor + extra
        if c.system == "pipecast" and c.schedule == "zb-h1" and c.workload == gpt
    ]
    configs = [c for c in anchor if c.gpus > 1] + [c for c in extra if c.gpus == wide]
    configs += [c for c in uncut if c.gpus == wide]
    configs += [c for c in seeds + thesis_cfgs if c.gpus == wide]
    configs += [c for c in extra + seeds + uncut if c.gpus == 2]
    configs += [c for c in anchor + extra + seeds + thesis_cfgs if c.gpus == 1]
    if args.no_torch:
        configs = [c for c in configs if c.system != "torch"]
    if args.graphs:  # the graphed twins after the whole eager suite (dry: the stand-in)
        configs += [
            replace(c, cuda_graphs=True)
            for c in configs
            if c.system == "pipecast"
            and c.schedule in ("gpipe", "1f1b", "interleaved")
            and c.recompute == "none"
            and c.cut_backward
            and not c.accuracy_steps
        ]
    configs = list({c.key: c for c in configs if c.gpus <= gpus}.values())
    if dry:
        configs = [replace(c, device="cpu", dtype="fp32", steps=2, warmup=1) for c in configs]
    else:  # the median of 10 steps after 3 warm-ups: small-micro-batch steps vary
        configs = [replace(c, steps=10, warmup=3) for c in configs]
    predicted = predictions(configs, profiles, cluster)
    log(
        f"{len(configs)} configurations, {len(predicted)} predicted, {left(args.budget):.0f} s left"
    )
    run_suite(
        configs,
        str(OUT / "bench.sqlite"),
        predicted=predicted,
        timeout_s=150,
        deadline=time.time() + left(args.budget),
        rounds=args.rounds,
    )
    if args.plain_profiles:  # after the suite, which a slow profile can't then cut short
        for name in host_bound_first(profiled):
            workload, sizes = profiled[name]
            profile(name, workload, sizes, device=device, dtype=dtype, plain=True)
    if args.late_profiles:  # each packed as it is saved: a call cut off keeps those done
        for name in host_bound_first(profiled):
            workload, sizes = profiled[name]
            began = time.time()
            late = profile_model(
                workload.build(),
                workload.spec,
                ProfileOptions(micro_batches=sizes[:1], device=device, dtype=dtype),  # type: ignore[arg-type]
                model_name=workload.model,
                workload=workload.to_dict(),
            )
            late.save(str(OUT / f"late_profile_{name}.json"))
            log(f"late profile {name} at {sizes[:1]}: {time.time() - began:.1f} s")
            pack()
    log("done")


if __name__ == "__main__":
    try:
        main()
    finally:
        pack()  # first: the end's readings take seconds (a new interpreter imports torch)
        if STATE is not None:  # the machine at the call's end, and what was stolen meanwhile
            end = record(OUT, "end")
            log(f"CPU time stolen by the hypervisor during this call: {steal_share(STATE, end)}")
            log(f"pure-Python loop, start -> end of this call, ms: {loop_change(STATE, end)}")
            cores = core_summary(end.get("core_loop_s", {}))
            log(f"pure-Python loop pinned to each CPU at the end: {cores}")
        pack()
