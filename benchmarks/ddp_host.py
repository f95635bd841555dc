"""Where does DDP over a CNN lose its time? Over the 28 stored runs, torch DDP over 4 GPUs
was predicted fast by a median 6-19% on ResNet-18, ResNet-50, ResNet-152 and MobileNetV2
(host-bound at 32 samples per GPU), while the same models on one GPU came within 1-3% and
GPT's and VGG-16's DDP rows within 2% (benchmarks/README.md, "Still fast: DDP over CNNs").

Every rank builds the model and takes its share of the suite's batch (128 over 4 GPUs,
bf16), and each model's step is timed four ways, in turn, in one launch:

* `one`: rank 0 trains its share alone, the other ranks idle (the profile's situation);
* `all`: every rank trains its share at once, no DDP (what 4 busy hosts cost);
* `ddp`: torch DDP as the suite runs it (buffers broadcast before every forward);
* `ddp_nobuf`: the same with `broadcast_buffers=False`.

Per variant: the slowest rank's median step (barriers around each step, as the suite
times) and each rank's median host time to issue the step (until `step()` returns). The
order of the variants turns from round to round; three rounds.

    cd benchmarks && OUT=/tmp/d python3 ddp_host.py        (--dry-run: tiny, on CPU ranks)

Writes ddp_host.json and logs every reading.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import common  # noqa: F401  (puts src/ on the path)
import torch
from common import OUT, dump, log

from pipecast.bench.baselines import build
from pipecast.bench.timing import barrier
from pipecast.data.loss import loss_for
from pipecast.data.synthetic import synthetic_batch
from pipecast.hardware import devices
from pipecast.models.workload import Workload
from pipecast.runtime.launch import Context, all_gather_floats, spawn

DRY = "--dry-run" in sys.argv or not torch.cuda.is_available()
if DRY:
    MODELS = (Workload(model="lenet5", dataset="mnist"),)
    WORLD, BATCH, DTYPE, STEPS, WARMUP, ROUNDS = 2, 16, "fp32", 2, 1, 2
else:
    MODELS = tuple(
        Workload(model=m, dataset="imagenet")
        for m in ("resnet18", "resnet152", "mobilenetv2", "vgg16")
    )
    WORLD, BATCH, DTYPE, STEPS, WARMUP, ROUNDS = 4, 128, "bf16", 10, 3, 3
VARIANTS = ("one", "all", "ddp", "ddp_nobuf")


def _device(ctx: Context) -> torch.device:
    return torch.device("cpu") if DRY else ctx.device


def _timed(step: Callable[[], None] | None, device: torch.device) -> tuple[float, float]:
    """(median step seconds with barriers around each step, median seconds to issue it); a
    rank without a step (None) only keeps to the others' barriers and reads 0 for both."""
    steps, issues = [], []
    for i in range(WARMUP + STEPS):
        barrier(device)
        began = time.perf_counter()
        if step is not None:
            step()
        issued = time.perf_counter()
        barrier(device)
        if i >= WARMUP:
            steps.append(time.perf_counter() - began)
            issues.append(issued - began)
    if step is None:
        return 0.0, 0.0
    return statistics.median(steps), statistics.median(issues)


def _variant(ctx: Context, workload: Workload, variant: str) -> tuple[float, float]:
    """One variant's reading on a fresh model (DDP's hooks stay on a model once wrapped),
    its memory handed back after."""
    reading = _fresh(ctx, workload, variant)
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
    return reading


def _fresh(ctx: Context, workload: Workload, variant: str) -> tuple[float, float]:
    from torch.nn.parallel import DistributedDataParallel

    device = _device(ctx)
    torch.manual_seed(0)
    model = build(workload, device, DTYPE)
    share = BATCH // ctx.world
    x, y = synthetic_batch(workload.spec, share, seed=ctx.rank, dtype=devices.DTYPES[DTYPE])
    x, y = x.to(device), y.to(device)
    loss_fn = loss_for(workload.spec)
    net: torch.nn.Module = model
    if variant.startswith("ddp"):
        net = DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            broadcast_buffers=variant == "ddp",
        )
    opt = torch.optim.SGD(net.parameters(), lr=1e-4)

    def step() -> None:
        torch.autograd.backward(loss_fn(net(x), y))
        opt.step()
        opt.zero_grad(set_to_none=True)

    active = variant != "one" or ctx.rank == 0
    return _timed(step if active else None, device)


def _rank(ctx: Context, round_: int) -> dict[str, dict[str, list[float]]]:
    """This round's readings on every rank: {model: {variant: [step s, issue s]}}; each
    variant's step is the slowest rank's, its issue this rank's."""
    out: dict[str, dict[str, list[float]]] = {}
    order = VARIANTS[round_ % len(VARIANTS) :] + VARIANTS[: round_ % len(VARIANTS)]
    for workload in MODELS:
        readings: dict[str, list[float]] = {}
        for variant in order:
            step, issue = _variant(ctx, workload, variant)
            slowest = max(r[0] for r in all_gather_floats([step], ctx.device))
            readings[variant] = [slowest, issue]
        out[workload.model] = {v: readings[v] for v in VARIANTS}
    return out


def main() -> None:
    backend = "gloo" if DRY else "nccl"
    name = "cpu" if DRY else torch.cuda.get_device_name(0)
    log(f"{WORLD} x {name}, torch {torch.__version__}, batch {BATCH} ({BATCH // WORLD} a rank)")
    result: dict[str, Any] = {"device": name, "torch": torch.__version__, "rounds": []}
    for round_ in range(ROUNDS):
        ranks = spawn(_rank, WORLD, (round_,), backend=backend, timeout_s=600)
        result["rounds"].append(ranks)
        for model in ranks[0]:
            cells = []
            for variant in VARIANTS:
                step = ranks[0][model][variant][0]
                issues = [r[model][variant][1] for r in ranks if r[model][variant][1] > 0]
                cells.append(
                    f"{variant} {step * 1e3:.1f} ms (issue "
                    + "/".join(f"{i * 1e3:.1f}" for i in issues)
                    + ")"
                )
            log(f"round {round_} {model}: " + ", ".join(cells))
        dump("ddp_host.json", result)
    log(f"wrote {OUT / 'ddp_host.json'}")


if __name__ == "__main__":
    main()
