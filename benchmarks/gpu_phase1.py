"""GPU phase 1: probe the machine, profile the anchor workloads (issue 3's bars), and run the
anchors suite: pipecast against torch.distributed.pipelining, DDP and one device (issue 6's
bar), every result written to a SQLite store as it completes.

    OUT=benchmarks/results/run1 python3 benchmarks/gpu_phase1.py --budget 540
    python3 benchmarks/gpu_phase1.py --dry-run      # the same flow, tiny, on CPU ranks
"""

from __future__ import annotations

import argparse
import time

import torch
from common import OUT, dump, left, log

from pipecast.bench.predictions import predictions
from pipecast.bench.runner import run_suite
from pipecast.bench.suites import GPT, VGG16, anchors
from pipecast.hardware.probe import ProbeOptions, probe
from pipecast.models.workload import Workload
from pipecast.partition import Setting, partition
from pipecast.profile.profiler import ProfileOptions, measure_step, profile_model


def profile_bar(
    name: str, workload: Workload, sizes: tuple[int, ...], check: int, *, device: str, dtype: str
) -> dict[str, object]:
    """Profile at `sizes`; compare the per-block sum at `check` with a whole-model step, and a
    second profile at `check` with the first."""
    options = ProfileOptions(micro_batches=sizes, device=device, dtype=dtype, warmup=3, repeats=9)  # type: ignore[arg-type]
    began = time.time()
    prof = profile_model(
        workload.build(),
        workload.spec,
        options,
        model_name=workload.model,
        workload=workload.to_dict(),
    )
    seconds = time.time() - began
    prof.save(str(OUT / f"profile_{name}.json"))
    again = profile_model(
        workload.build(),
        workload.spec,
        ProfileOptions(
            micro_batches=(check,),
            device=device,
            dtype=dtype,  # type: ignore[arg-type]
            warmup=3,
            repeats=9,
        ),
        model_name=workload.model,
    )
    whole = prof.stage(0, prof.num_blocks, check)
    whole2 = again.stage(0, again.num_blocks, check)
    block_sum = whole.forward + whole.backward
    step = measure_step(
        workload.build(),
        workload.spec,
        check,
        ProfileOptions(device=device, dtype=dtype, warmup=3, repeats=9),
    )  # type: ignore[arg-type]
    result = {
        "micro_batch": check,
        "sum_of_blocks_s": block_sum,
        "whole_step_s": step,
        "ratio": block_sum / step,
        "second_profile_sum_s": whole2.forward + whole2.backward,
        "profile_agreement": (whole2.forward + whole2.backward) / block_sum,
        "profile_seconds": seconds,
        "sizes": list(sizes),
        "device": prof.device,
    }
    log(
        f"profile {name}: blocks {block_sum * 1e3:.2f} ms vs step {step * 1e3:.2f} ms "
        f"(ratio {result['ratio']:.3f}), second profile ratio {result['profile_agreement']:.3f}, "
        f"{seconds:.1f} s"
    )
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"profile": prof, "bar": result}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=540.0)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--skip-probe", action="store_true")
    args = ap.parse_args()
    device = "cpu" if args.dry_run else "cuda"
    gpus = 2 if args.dry_run else torch.cuda.device_count()
    env = {
        "torch": torch.__version__,
        "gpus": gpus,
        "names": [torch.cuda.get_device_name(i) for i in range(gpus)]
        if device == "cuda"
        else ["cpu"],
    }
    dump("environment.json", env)
    log(f"environment: {env}")

    if args.dry_run:
        gpt = Workload(
            model="transformer", dataset="embeddings", seq_len=16, width=32, layers=8, heads=4
        )
        vgg = Workload(model="vgg11", dataset="cifar10")
        dtype, gpt_sizes, vgg_sizes = "fp32", (1, 2), (2, 4)
    else:
        gpt, vgg, dtype, gpt_sizes, vgg_sizes = GPT, VGG16, "bf16", (1, 2, 4, 8), (4, 8, 16, 32)

    result = probe(
        ProbeOptions(
            devices=gpus,
            device=device,
            max_bytes=2**20 if args.dry_run else 256 * 2**20,
            repeats=5,
            matmul_size=256 if args.dry_run else 0,
        )
    )
    cluster = result.cluster
    cluster.save(str(OUT / "cluster.json"))
    dump("probe_raw.json", result.to_dict())
    busbw = [(n, round(b / 1e9, 1)) for n, b in cluster.allreduce_busbw.items()]
    log(
        f"probe: intra {cluster.intra.bandwidth / 1e9:.1f} GB/s, "
        f"{cluster.intra.latency * 1e6:.1f} us; all-reduce {busbw} GB/s; matmul "
        f"{cluster.matmul_flops / 1e12:.0f} TFLOP/s; memory {cluster.memory_bytes / 2**30:.1f} GiB"
    )

    bars = {}
    vgg_p = profile_bar("vgg", vgg, vgg_sizes, vgg_sizes[-1], device=device, dtype=dtype)
    bars["vgg16"] = vgg_p["bar"]
    gpt_p = profile_bar("gpt", gpt, gpt_sizes, gpt_sizes[-2], device=device, dtype=dtype)
    bars["gpt"] = gpt_p["bar"]
    if not args.dry_run:
        r152 = Workload(model="resnet152", dataset="imagenet")
        began = time.time()
        prof = profile_model(
            r152.build(),
            r152.spec,
            ProfileOptions(micro_batches=(8, 16, 32), device=device, dtype=dtype),  # type: ignore[arg-type]
            model_name="resnet152",
        )
        bars["resnet152_profile_seconds"] = time.time() - began
        prof.save(str(OUT / "profile_resnet152.json"))
        log(f"profile resnet152 at 3 sizes: {bars['resnet152_profile_seconds']:.1f} s")
        torch.cuda.empty_cache()
    dump("profile_bars.json", bars)

    vgg_prof, gpt_prof = vgg_p["profile"], gpt_p["profile"]
    if args.dry_run:
        configs = anchors(
            (0, 4, 8),
            (0, 2, 4, 6, 8),
            (0, 8, 16, 29),
            None,
            gpus=2,
            gpt=gpt,
            vgg=vgg,
            gpt_batch=16,
            vgg_batch=16,
        )
        from dataclasses import replace

        configs = [replace(c, device="cpu", dtype="fp32", steps=2, warmup=1) for c in configs]
    else:
        setting = Setting(micro_batch=16, microbatches=8, schedule="1f1b", memory_margin=0.1)
        balanced = partition(vgg_prof, cluster, 4, setting, "balanced").boundaries
        log(f"pipecast's VGG-16 split: {balanced}")
        configs = anchors(vgg_pipecast=tuple(balanced))
    predicted = predictions(configs, {gpt.key: gpt_prof, vgg.key: vgg_prof}, cluster)
    log(
        f"anchors: {len(configs)} configurations, {len(predicted)} predicted; "
        f"{left(args.budget):.0f} s left"
    )
    run_suite(
        configs,
        str(OUT / "bench.sqlite"),
        predicted=predicted,
        timeout_s=180,
        deadline=time.time() + left(args.budget),
    )
    log("done")


if __name__ == "__main__":
    main()
