"""Why does pipecast's runtime issue a model's work slower than a plain loop? On 2 x H200
(host_context.py) a rank ran VGG-16/CIFAR-10, 8 micro-batches of 4, in 28 ms as a plain
forward/backward loop and in 43-45 ms through the runtime. This times, in one spawned rank,
the plain loop, the plain loop with the runtime's backward call (explicit inputs), and the
runtime, each with torch's default intra-op threads for the rank and with one thread.

    cd benchmarks && OUT=/tmp/r python3 runtime_host.py     (on a CPU: the same, fp32 + gloo)

Writes runtime_host.json: host seconds per micro-batch (median of 10 steps after 3 warm-ups).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import common  # noqa: F401  (puts src/ on the path)
import torch
from host_context import MICRO, STEPS, WARMUP, WORKLOAD, M, runtime_job

from pipecast.data import get_spec
from pipecast.data.loss import loss_for
from pipecast.data.synthetic import synthetic_batch
from pipecast.hardware import devices
from pipecast.runtime.launch import Context, spawn
from pipecast.runtime.worker import run_rank

OUT = Path(os.environ.get("OUT", "."))


def plain(device: torch.device, *, explicit: bool) -> float:
    """Host seconds per micro-batch of forward, loss, backward (explicit: the runtime's
    torch.autograd.backward call with the parameters as inputs)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = WORKLOAD.build().to(device, dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    spec = get_spec(WORKLOAD.dataset)
    x, target = synthetic_batch(spec, MICRO, seed=0, dtype=dtype)
    x, target = x.to(device), target.to(device)
    loss_fn = loss_for(spec)
    times = []
    for i in range(WARMUP + STEPS):
        devices.synchronize(device)
        began = time.perf_counter()
        for _ in range(M):
            loss = loss_fn(model(x), target)
            if explicit:
                torch.autograd.backward(loss, torch.ones_like(loss), inputs=params)
            else:
                loss.backward()
        if i >= WARMUP:
            times.append((time.perf_counter() - began) / M)
        devices.synchronize(device)
        model.zero_grad(set_to_none=True)
    return statistics.median(times)


def runtime(ctx: Context) -> dict[str, float]:
    job = runtime_job(ctx.device, clock=False)
    report = run_rank(ctx, job)
    out = {"loop": statistics.median(s.host_loop for s in report.steps) / M}
    for kind in ("F", "BW"):
        out[kind] = statistics.median(s.host.get(kind, 0.0) for s in report.steps) / M
    return out


def on_rank(ctx: Context) -> dict[str, Any]:
    out: dict[str, Any] = {"threads": torch.get_num_threads()}
    for threads in (None, 1):
        if threads:
            torch.set_num_threads(threads)
        tag = "default" if threads is None else f"{threads}_thread"
        out[f"plain_{tag}"] = plain(ctx.device, explicit=False)
        out[f"plain_explicit_{tag}"] = plain(ctx.device, explicit=True)
        out[f"runtime_{tag}"] = runtime(ctx)
        out[f"plain_again_{tag}"] = plain(ctx.device, explicit=False)
    return out


def profiled(device: torch.device) -> dict[str, float]:
    """What the profiler reads for the same work: host seconds per micro-batch of the whole
    model's forward and backward (one stage), and the loss's."""
    from pipecast.profile.profiler import ProfileOptions, profile_model

    dtype = "bf16" if device.type == "cuda" else "fp32"
    prof = profile_model(
        WORKLOAD.build(),
        get_spec(WORKLOAD.dataset),
        ProfileOptions(micro_batches=(MICRO,), device=device.type, dtype=dtype),  # type: ignore[arg-type]
        model_name=WORKLOAD.model,
    )
    whole = prof.stage(0, prof.num_blocks, MICRO)
    return {
        "host_forward": whole.host_forward,
        "host_backward": whole.host_backward,
        "host_issue": prof.host_issue,
        "plain_after": plain(device, explicit=False),
    }


def main() -> None:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    backend = "nccl" if cuda else "gloo"
    result: dict[str, Any] = {"torch": torch.__version__, "gpu": devices.name(device)}
    began = time.time()
    result["driver"] = {"threads": torch.get_num_threads(), "plain": plain(device, explicit=False)}
    result["rank"] = spawn(on_rank, 1, backend=backend, timeout_s=300)[0]
    result["driver_again"] = {"plain": plain(device, explicit=False)}
    for n in range(2):
        result[f"profiled_{n}"] = profiled(device)
    result["seconds"] = time.time() - began
    (OUT / "runtime_host.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1), flush=True)


if __name__ == "__main__":
    main()
