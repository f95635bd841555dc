"""`pipecast infer --compare onnxruntime`: the pipeline's outputs and speed beside one
process and ONNX Runtime, on the same weights and the same last batch."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from rich.table import Table

from pipecast.cli.console import console, human_seconds
from pipecast.data.synthetic import synthetic_batch
from pipecast.hardware import devices
from pipecast.interop import onnx_runtime
from pipecast.runtime.run import JobResult


def last_batch(result: JobResult) -> torch.Tensor:
    """The inputs of the run's last step, drawn again as the ranks drew them (fp32, CPU)."""
    job = result.job
    assert job.workload is not None
    seed = job.config.seed + job.total_steps - 1
    x, _ = synthetic_batch(job.workload.spec, job.batch, seed=seed)
    return x


def one_process(result: JobResult) -> torch.nn.Module:
    """The whole model in one process with the weights the pipeline ended with."""
    params: dict[str, torch.Tensor] = {}
    for r in result.reports:
        if r.replica == 0:
            params.update(r.params)
    assert result.job.workload is not None
    model = result.job.workload.build()
    model.load_state_dict(params, strict=False)  # buffers are the model's own, as built
    return model.float().eval()


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    """Median seconds of `fn` after one warm-up: 10 runs, or as many as fit in 10 s."""
    fn()
    times: list[float] = []
    while len(times) < 10 and (len(times) < 2 or sum(times) < 10.0):
        began = time.perf_counter()
        fn()
        devices.synchronize(device)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def compare(result: JobResult) -> float:
    """Print the three runtimes' batch time, samples/s and one-request latency, and each
    one's largest output difference from one process; return the pipeline's."""
    x = last_batch(result)
    pipeline = torch.cat([o for r in result.reports if r.outputs for o in r.outputs]).float()
    model = one_process(result)
    # one process on the pipeline's kind of device (its first), in fp32
    here = torch.device("cuda", 0) if result.job.device == "cuda" else torch.device("cpu")
    on = model.to(here)
    xs = x.to(here)
    with torch.no_grad():
        want = on(xs).cpu()
        batch_s = _timed(lambda: on(xs), here)
        request_s = _timed(lambda: on(xs[:1]), here)
    ort = onnx_runtime.run(model.cpu(), x)
    step = result.summary["step_time"]
    table = Table(title=f"inference, batch {len(x)}: the last step's inputs")
    columns = ("runtime", "batch", "samples/s", "one request", "largest |difference|",
               "relative")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="right")
    rows = [
        (f"pipecast ({result.job.world} ranks, {result.job.config.dtype})", step, "-", pipeline),
        (f"PyTorch, one process ({here.type})", batch_s, human_seconds(request_s), want),
        (f"ONNX Runtime ({ort.provider})", ort.batch_seconds,
         human_seconds(ort.request_seconds), ort.outputs),
    ]  # fmt: skip
    scale = float(want.norm())
    for name, seconds, request, out in rows:
        gap = (out - want).float()
        table.add_row(name, human_seconds(seconds), f"{len(x) / seconds:,.1f}", request,
                      f"{float(gap.abs().max()):.2e}",
                      f"{float(gap.norm()) / scale:.1e}" if scale else "-")  # fmt: skip
    console.print(table)
    console.print(
        "differences from one process in fp32 on the same weights and inputs; relative: "
        "||out - reference|| / ||reference|| (bf16 lands near 1e-2, fp32 far under 1e-3)"
    )
    return float((pipeline - want).norm()) / scale if scale else 0.0
