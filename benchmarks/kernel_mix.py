"""Where one step's GPU time goes, by kind of kernel: one traced step, pipecast's or torch's.

    python -m benchmarks.one_gpu --set trace --out DIR

A run traced here is a `benchmarks.one_gpu` run with ONE_GPU_TRACE=DIR/NAME set: the step
before the last runs under torch.profiler, and DIR/NAME.json holds its kernels summed by kind
(matrix multiplies, attention, the optimizer, inductor's fused kernels, other elementwise,
copies), the device's busy time (the union of kernel intervals) and the step's span, so a gap
between two systems' steps can be named: more kernel time of one kind, or idle device time.
"""

from __future__ import annotations

from typing import Any

import torch

from pipecast.measuring.kernel_trace import KernelTracer as StepTracer
from pipecast.measuring.kernel_trace import kind_of, summarize

__all__ = ["StepTracer", "kind_of", "summarize", "torch_traced"]


def torch_traced(load: Any, mode: str, out: str) -> dict[str, Any]:
    """torch's own step on `load` (the anchor's loop: bf16 weights, fused Adam or SGD,
    `mode` eager, compile (each GPT block) or compile-whole), step 4 traced to `out`."""
    import torch.nn.functional as F

    from pipecast.values.models.workload import Workload

    torch.manual_seed(0)
    dev = torch.device("cuda")
    wl = Workload(
        model=load.model, dataset=load.dataset, width=load.width or 512, layers=load.layers,
        heads=load.heads, seq_len=load.seq or 256,
    )  # fmt: skip
    model = wl.build().to(torch.bfloat16).to(dev)
    if mode == "compile":
        for i, b in enumerate(list(model.children())):
            if load.model != "gpt" or b.__class__.__name__ == "Block":
                model[i] = torch.compile(b)
    elif mode == "compile-whole":
        model = torch.compile(model)
    params = list(model.parameters())
    opt: torch.optim.Optimizer = (
        torch.optim.Adam(params, lr=1e-4, fused=True)
        if load.optim == "adam"
        else torch.optim.SGD(params, lr=1e-3)
    )
    if load.dataset == "tokens":
        x = torch.randint(0, wl.vocab, (load.batch, load.seq), device=dev)
        y = torch.randint(0, wl.vocab, (load.batch, load.seq), device=dev)
    else:
        x = torch.randn((load.batch, *wl.spec.sample_shape), device=dev, dtype=torch.bfloat16)
        y = torch.randint(0, wl.spec.num_classes, (load.batch,), device=dev)
    tracer = StepTracer(out, 4)
    for step in range(6):
        tracer(0, step)
        o = model(x)
        o = o.float().reshape(-1, o.shape[-1]) if load.dataset == "tokens" else o.float()
        F.cross_entropy(o, y.reshape(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"traced": out}
