"""The same model and weights in DeepSpeed's inference engine (`deepspeed.init_inference`,
the engine "A Comparative Study on Synchronous Pipeline Parallelism Techniques" compares
with ONNX Runtime), on its accelerator (CUDA where present),
in fp32, without its kernel injection (which replaces only the transformer layers it knows)."""

from __future__ import annotations

import logging

import torch
from torch import nn

from pipecast.extras import require
from pipecast.measuring.interop.timed_run import TimedRun, timed_module

INSTALL = "pip install --no-build-isolation deepspeed"
"""DeepSpeed's sdist imports torch while it builds."""


def run(model: nn.Module, inputs: torch.Tensor) -> TimedRun:
    ds = require("deepspeed", needed_by="--compare deepspeed", install=INSTALL)
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    engine = ds.init_inference(
        model.float().eval(), dtype=torch.float32, replace_with_kernel_inject=False
    )
    device = next(engine.module.parameters()).device
    x = inputs.detach().float().to(device)
    return timed_module(f"DeepSpeed inference ({device.type})", engine, x)
