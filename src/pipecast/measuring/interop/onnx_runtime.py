"""The same model, weights and inputs in ONNX Runtime, beside pipecast's pipelined inference.

The model goes through torch.onnx's exporter (torch.export-based) with a dynamic batch
dimension, in fp32 (ONNX Runtime's kernels for bf16 are few), and runs in an
InferenceSession on CUDA where ONNX Runtime has that provider, else on the CPU. Timed as
pipecast.measuring.interop.timed_run says.
"""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
import warnings
from pathlib import Path

import torch
from torch import nn

from pipecast.extras import require
from pipecast.measuring.interop.timed_run import TimedRun, median_seconds

INSTALL = "pip install 'pipecast[onnx]'"
"""onnxruntime, with onnx and onnxscript for torch.onnx's exporter."""


def export(model: nn.Module, example: torch.Tensor, path: Path) -> Path:
    """`model` (on the CPU, fp32, eval mode) as an ONNX file with a dynamic batch."""
    batch = torch.export.Dim("batch", min=1)
    quiet = logging.getLogger("torch.onnx")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # it notes every optional package it does not find
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # and narrates its passes
            torch.onnx.export(
                model, (example,), str(path), dynamo=True, input_names=["x"],
                output_names=["y"], dynamic_shapes=({0: batch},),
            )  # fmt: skip
    finally:
        quiet.setLevel(level)
    return path


def run(model: nn.Module, inputs: torch.Tensor) -> TimedRun:
    """Export `model` and run `inputs` through ONNX Runtime: the outputs and the timings."""
    ort = require("onnxruntime", needed_by="--compare onnxruntime", install=INSTALL)
    model = model.float().eval().cpu()
    x = inputs.detach().float().cpu()
    providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider")
                 if p in ort.get_available_providers()]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        path = export(model, x[: min(2, len(x))], Path(tmp) / "model.onnx")
        session = ort.InferenceSession(str(path), providers=providers)
    name = session.get_inputs()[0].name
    whole, one = {name: x.numpy()}, {name: x[:1].numpy()}
    out = session.run(None, whole)[0]
    return TimedRun(
        runtime=f"ONNX Runtime ({session.get_providers()[0]})",
        batch=len(x),
        batch_seconds=median_seconds(lambda: session.run(None, whole)),
        request_seconds=median_seconds(lambda: session.run(None, one)),
        outputs=torch.from_numpy(out),
    )
