"""Gradient clipping, learning-rate schedules and real samples on GPUs: equal to one process,
and what clipping costs a step.

1. Equivalence (fp32, 2 GPUs, NCCL): a small transformer (6 layers of width 64, no dropout)
   under 1F1B and ZB-H1 at M=4, trained for 4 steps on given samples (ArrayData, 24 samples
   in batches of 8: the steps cross an epoch), clipped to a global norm of 0.05, with a
   cosine schedule after one warm-up step. It is compared with one process on one GPU that
   draws the same batches, clips with torch.nn.utils.clip_grad_norm_ and sets the same rates:
   the largest relative difference of any parameter. Two unclipped runs show how far the GPUs
   differ from one process anyway.
2. Cost: GPT (24 layers of width 2048, batch 32, bf16, Adam) under 1F1B at M=8 over 2 GPUs,
   without clipping and clipped to 1.0 in turn over three rounds, in a fresh world per run;
   the median of 10 steps after 3.
3. Loss scaling (`--part fp16`): the small transformer in fp16 autocast, SGD, from a scale of
   2**20 that doubles after 2 clean steps, 6 steps under 1F1B over 2 GPUs, against one process
   on one GPU accumulating the same 4 micro-batches under torch.amp.GradScaler (an overflow
   depends on what one backward sums: a whole batch's weight gradients in fp16 overflow
   where a micro-batch's do not): the scales and skipped steps, and the weights.

    OUT=/tmp/feat python3 benchmarks/training_features.py [--dry-run]   (dry: CPU ranks, tiny)
        [--part equal|cost|fp16]   (one part alone; default: equal and cost)
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from typing import Any

import common  # noqa: F401  (puts src/ on the path)
import torch
from common import dump, log, pack

from pipecast.api import make_job
from pipecast.bench.suites import GPT
from pipecast.data.arrays import ArrayData
from pipecast.data.loss import loss_for
from pipecast.models.workload import Workload
from pipecast.runtime.config import RunConfig
from pipecast.runtime.run import run_job
from pipecast.training import learning_rate

SMALL = Workload(model="transformer", dataset="embeddings", seq_len=32, width=64, layers=6, heads=4)


def _samples(n: int) -> ArrayData:
    g = torch.Generator().manual_seed(7)
    shape = (n, *SMALL.spec.sample_shape)
    return ArrayData(torch.randn(shape, generator=g), torch.randn(shape, generator=g))


def _reference(
    data: ArrayData, config: RunConfig, batch: int, steps: int, device: torch.device
) -> dict[str, torch.Tensor]:
    torch.manual_seed(config.seed)
    model = SMALL.build().to(device)
    loss_fn = loss_for(SMALL.spec)
    drawn: list[tuple[torch.Tensor, torch.Tensor]] = []
    epoch = 0
    while len(drawn) < steps:
        drawn += list(data.batches(batch, seed=epoch))
        epoch += 1
    for step, (x, y) in enumerate(drawn[:steps]):
        model.zero_grad(set_to_none=True)
        loss_fn(model(x.to(device)), y.to(device)).backward()
        if config.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad_norm)
        lr = learning_rate(
            config.lr, step, steps, schedule=config.lr_schedule, warmup=config.lr_warmup
        )
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad  # type: ignore[operator]
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters()}


def loss_scaling(dry: bool) -> dict[str, Any]:
    device = torch.device("cpu" if dry else "cuda")
    data = _samples(24)
    config = RunConfig(
        dtype="fp16",
        autocast=True,
        lr=0.05,
        timeout_s=60,
        loss_scale=2.0**20,
        loss_scale_interval=2,
    )
    steps = 6
    job, _ = make_job(
        SMALL,
        gpus=2,
        schedule="1f1b",
        microbatches=4,
        batch=8,
        partition="0,3,6",
        steps=steps,
        warmup_steps=0,
        device=device.type,
        config=config,
        exact_init=True,
        data=data,
    )
    result = run_job(replace(job, capture=True))
    assert result is not None
    got: dict[str, torch.Tensor] = {}
    for r in result.reports:
        got.update(r.params)
    last = next(r for r in result.reports if r.pipeline_rank == 1)
    torch.manual_seed(config.seed)
    model = SMALL.build().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**20, growth_interval=2)
    drawn = list(data.batches(8, seed=0)) + list(data.batches(8, seed=1))
    scales = []
    for x, y in drawn[:steps]:  # the pipeline's 4 micro-batches, accumulated
        opt.zero_grad(set_to_none=True)
        scales.append(scaler.get_scale())
        for xm, ym in zip(x.to(device).chunk(4), y.to(device).chunk(4), strict=True):
            with torch.autocast(device.type, dtype=torch.float16):
                out = model(xm)
            loss = loss_for(SMALL.spec)(out, ym) * (len(xm) / len(x))
            scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    want = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
    row = {
        "scales": [s.loss_scale for s in last.steps],
        "skipped": [s.skipped for s in last.steps],
        "scales_gradscaler": scales,
        "worst_rel": _worst(want, got),
    }
    log(
        f"fp16 loss scaling: pipeline scales {row['scales']} skipped {row['skipped']}; "
        f"GradScaler {scales}; weights worst {row['worst_rel']:.2e}"
    )
    return row


def _worst(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) / max(float(a[k].abs().max()), 1e-12) for k in a)


def equivalence(dry: bool) -> list[dict[str, Any]]:
    device = "cpu" if dry else "cuda"
    data = _samples(24)
    rows = []
    clipped = RunConfig(
        lr=0.05, timeout_s=60, clip_grad_norm=0.05, lr_schedule="cosine", lr_warmup=1
    )
    for schedule in ("1f1b", "zb-h1"):
        for config in (clipped, replace(clipped, clip_grad_norm=0.0)):
            job, _ = make_job(
                SMALL,
                gpus=2,
                schedule=schedule,
                microbatches=4,
                batch=8,
                partition="0,3,6",
                steps=4,
                warmup_steps=0,
                device=device,
                config=config,
                exact_init=True,
                data=data,
            )
            job = replace(job, capture=True)
            result = run_job(job)
            assert result is not None
            got: dict[str, torch.Tensor] = {}
            for r in result.reports:
                got.update(r.params)
            want = _reference(data, config, 8, 4, torch.device(device))
            norms = [s.grad_norm for r in result.reports if r.global_rank == 0 for s in r.steps]
            row = {
                "schedule": schedule,
                "clip": config.clip_grad_norm,
                "worst_rel": _worst(want, got),
                "grad_norms": norms,
            }
            log(
                f"equal {schedule} clip {config.clip_grad_norm}: worst {row['worst_rel']:.2e}, "
                f"norms {norms}"
            )
            rows.append(row)
    return rows


def cost(dry: bool, rounds: int) -> list[dict[str, Any]]:
    workload = SMALL if dry else GPT
    rows: list[dict[str, Any]] = []
    for round_ in range(rounds):
        for clip in (0.0, 1.0):
            job, _ = make_job(
                workload,
                gpus=2,
                schedule="1f1b",
                microbatches=8,
                batch=16 if dry else 32,
                partition="0,3,6" if dry else "0,12,24",
                steps=10,
                warmup_steps=3,
                device="cpu" if dry else "cuda",
                config=RunConfig(
                    dtype="fp32" if dry else "bf16",
                    optimizer="adam",
                    lr=1e-4,
                    clip_grad_norm=clip,
                    timeout_s=120,
                ),
                exact_init=dry,
            )
            result = run_job(job)
            assert result is not None
            row = {"round": round_, "clip": clip, "step_time": result.summary["step_time"]}
            log(f"round {round_} clip {clip}: {row['step_time'] * 1e3:.2f} ms")
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--part", choices=("equal", "cost", "fp16"))
    args = ap.parse_args()
    if args.part == "fp16":
        dump("training_features_fp16.json", loss_scaling(args.dry_run))
        pack()
        return
    out: dict[str, Any] = {"equivalence": equivalence(args.dry_run)}
    dump("training_features.json", out)
    out["cost"] = cost(args.dry_run, args.rounds)
    for clip in (0.0, 1.0):
        times = [r["step_time"] for r in out["cost"] if r["clip"] == clip]
        out[f"median_clip_{clip}"] = statistics.median(times)
    log(
        f"median step: unclipped {out['median_clip_0.0'] * 1e3:.2f} ms, clipped "
        f"{out['median_clip_1.0'] * 1e3:.2f} ms"
    )
    dump("training_features.json", out)
    pack()


if __name__ == "__main__":
    main()
