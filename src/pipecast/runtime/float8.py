"""Float8 training: each Linear's matrix products in 8-bit floats, through torchao.

`convert` swaps a stage's Linears for torchao's Float8Linear (tensorwise dynamic scaling:
the input and weight cast to e4m3, the output's gradient to e5m2, each scaled by its own
amax), as torchtitan trains in Float8. The weights and the optimizer stay in the run's
dtype; only the products go through the GPU's FP8 units, which need compute capability
8.9 (Ada, Hopper) or newer. Float8 pays where the products are large and compiled: torchao
casts in separate kernels unless inductor fuses them (RunConfig.compile).
"""

from __future__ import annotations

import importlib.util

import torch
from torch import nn

INSTALL = "pip install 'pipecast[float8]'"
MIN_CAPABILITY = (8, 9)
ALIGN = 16
"""FP8 matrix products take dimensions that are multiples of 16: smaller or odd Linears
stay in the run's dtype."""


def why_not(device: str) -> str | None:
    """Why a run on `device` ('cuda' or 'cpu') can't train in Float8 (None: it can)."""
    if importlib.util.find_spec("torchao") is None:
        return f"Float8 training needs torchao: {INSTALL}"
    if device != "cuda" or not torch.cuda.is_available():
        return (
            "Float8 training needs a GPU with FP8 matrix units (H100, H200, L40): use --device cuda"
        )
    found = torch.cuda.get_device_capability()
    if found < MIN_CAPABILITY:
        name = torch.cuda.get_device_name()
        return (
            f"{name} (compute capability {found[0]}.{found[1]}) has no FP8 matrix units, which "
            f"Float8 training needs ({MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer: H100, "
            "H200, L40): train in bf16"
        )
    return None


def eligible(module: nn.Module, _: str) -> bool:
    """Linears whose both dimensions FP8 products take (multiples of ALIGN)."""
    return (
        isinstance(module, nn.Linear)
        and module.in_features % ALIGN == 0
        and module.out_features % ALIGN == 0
    )


def convert(module: nn.Module) -> int:
    """Swap `module`'s eligible Linears for Float8Linear in place; how many were swapped."""
    from torchao.float8 import convert_to_float8_training

    before = sum(1 for m in module.modules() if eligible(m, ""))
    convert_to_float8_training(module, module_filter_fn=eligible)
    return before
