"""`pipecast infer --compare onnxruntime|deepspeed`: the pipeline's outputs and speed beside
one process and other runtimes, on the same weights and the same last batch."""

from __future__ import annotations

import torch
from rich.table import Table

from pipecast.cli.console import console, human_seconds
from pipecast.measuring.interop import deepspeed_inference, onnx_runtime
from pipecast.measuring.interop.timed_run import TimedRun, timed_module
from pipecast.runtime.run import JobResult
from pipecast.runtime.worker import drawn_batch


def _first_device(result: JobResult) -> torch.device:
    """The first of the ranks' devices: where one process runs and the batch is drawn."""
    return torch.device("cuda", 0) if result.job.device == "cuda" else torch.device("cpu")


def last_batch(result: JobResult) -> torch.Tensor:
    """The inputs of the run's last step, drawn again as the ranks drew them, on the first
    of their devices (fp32, CPU)."""
    job = result.job
    return drawn_batch(job, job.total_steps - 1, _first_device(result)).float().cpu()


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


def _torch(model: torch.nn.Module, x: torch.Tensor, here: torch.device) -> TimedRun:
    """One process, on the pipeline's kind of device (its first), in fp32."""
    runtime = f"PyTorch, one process ({here.type})"
    return timed_module(runtime, model.to(here), x.to(here), warmup=1)


RUNTIMES = {"onnxruntime": onnx_runtime.run, "deepspeed": deepspeed_inference.run}
"""--compare's runtimes: each takes the model (fp32, CPU) and the inputs."""


def compare(result: JobResult, runtimes: list[str]) -> None:
    """Print the pipeline's, one process's and each of `runtimes`' batch time, samples/s,
    one-request latency and output difference from one process."""
    x = last_batch(result)
    pipeline = torch.cat([o for r in result.reports if r.outputs for o in r.outputs]).float()
    model = one_process(result)
    reference = _torch(model, x, _first_device(result))
    want = reference.outputs
    others = [RUNTIMES[name](model.cpu(), x) for name in dict.fromkeys(runtimes)]
    table = Table(title=f"inference, batch {len(x)}: the last step's inputs")
    columns = ("runtime", "batch", "samples/s", "one request", "largest |difference|",
               "relative")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="right")
    job = result.job
    rows = [(f"pipecast ({job.world} ranks, {job.config.dtype})", result.summary["step_time"],
             "-", pipeline)]  # fmt: skip
    rows += [(r.runtime, r.batch_seconds, human_seconds(r.request_seconds), r.outputs)
             for r in (reference, *others)]  # fmt: skip
    scale = float(want.norm())
    for name, seconds, request, out in rows:
        gap = out.float() - want
        table.add_row(name, human_seconds(seconds), f"{len(x) / seconds:,.1f}", request,
                      f"{float(gap.abs().max()):.2e}",
                      f"{float(gap.norm()) / scale:.1e}" if scale else "-")  # fmt: skip
    console.print(table)
    console.print(
        "differences from one process in fp32 on the same weights and inputs; relative: "
        "||out - reference|| / ||reference|| (bf16 lands near 1e-2, fp32 far under 1e-3)"
    )
