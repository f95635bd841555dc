"""The same model and weights in DeepSpeed's inference engine (`deepspeed.init_inference`,
the engine seeds/002 compares with ONNX Runtime), on its accelerator (CUDA where present),
in fp32, without its kernel injection (which replaces only the transformer layers it knows)."""

from __future__ import annotations

import importlib
import logging

import torch
from torch import nn

from pipecast.errors import ConfigError
from pipecast.interop.timed_run import TimedRun, median_seconds


def run(model: nn.Module, inputs: torch.Tensor) -> TimedRun:
    try:
        ds = importlib.import_module("deepspeed")
    except ImportError:
        raise ConfigError(
            "--compare deepspeed needs DeepSpeed: pip install --no-build-isolation deepspeed"
        ) from None
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    engine = ds.init_inference(
        model.float().eval(), dtype=torch.float32, replace_with_kernel_inject=False
    )
    device = next(engine.module.parameters()).device
    x = inputs.detach().float().to(device)

    def answer(batch: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            out: torch.Tensor = engine(batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return out

    return TimedRun(
        runtime=f"DeepSpeed inference ({device.type})",
        batch=len(x),
        batch_seconds=median_seconds(lambda: answer(x)),
        request_seconds=median_seconds(lambda: answer(x[:1])),
        outputs=answer(x).cpu(),
    )
