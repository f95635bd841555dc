"""Which of a block's projections tensor parallelism splits, and how (Megatron's plan).

In attention the query, key and value projections split column-wise (each rank computes its
own heads) and the output projection row-wise (each rank's heads' share, summed across the
ranks); in the MLP the first projection splits column-wise and the second row-wise. A block's
forward then needs one all-reduce after attention and one after the MLP, and its backward
the same two. The runtime hands the plan to torch's parallelize_module; the profiler times
a block at its sharded shapes from the same plan.
"""

from __future__ import annotations

from typing import Literal

from torch import nn

from pipecast.errors import ConfigError

Split = Literal["colwise", "rowwise"]
Plan = dict[str, Split]

GPT: Plan = {
    "attn.q": "colwise",
    "attn.k": "colwise",
    "attn.v": "colwise",
    "attn.proj": "rowwise",
    "mlp.up": "colwise",
    "mlp.down": "rowwise",
}
"""The zoo's GPT block (values/models/gpt.py)."""

LLAMA: Plan = {
    "self_attn.q_proj": "colwise",
    "self_attn.k_proj": "colwise",
    "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise",
    "mlp.gate_proj": "colwise",
    "mlp.up_proj": "colwise",
    "mlp.down_proj": "rowwise",
}
"""A Llama-style decoder layer (Hugging Face's names)."""

PLANS = (GPT, LLAMA)

ALL_REDUCES_PER_PASS = 2
"""All-reduces of a planned block's output per forward (after attention and after the MLP),
and per backward (of its input's gradient at the two column-wise splits)."""


def plan_of(block: nn.Module) -> Plan | None:
    """The plan whose projections `block` has, each an nn.Linear; None: none fits."""
    modules = dict(block.named_modules())
    for plan in PLANS:
        if all(isinstance(modules.get(name), nn.Linear) for name in plan):
            return plan
    return None


def heads_of(block: nn.Module, plan: Plan) -> int:
    """Attention heads of a planned block: its query projection's width over the head size
    (the attention's `head_dim`, or the model's `head_dim` attribute), 0 where unknown."""
    modules = dict(block.named_modules())
    query = next(name for name in plan if name.endswith(("q", "q_proj")))
    attention = modules[query.rpartition(".")[0]]
    head_dim = getattr(attention, "head_dim", 0)
    linear = modules[query]
    assert isinstance(linear, nn.Linear)
    return int(linear.out_features // head_dim) if head_dim else 0


def why_not_split(blocks: list[nn.Module], degree: int) -> str | None:
    """Why `degree`-way tensor parallelism cannot split this model (None: it can): no block
    has a plan, or a planned block's heads or widths do not divide by `degree`."""
    if degree < 1:
        return f"tensor-parallel degree must be at least 1, got {degree}"
    planned = [(i, b, plan) for i, b in enumerate(blocks) if (plan := plan_of(b)) is not None]
    if not planned:
        kinds = {type(b).__name__ for b in blocks}
        if "TransformerEncoderLayer" in kinds:
            return (
                "nn.TransformerEncoderLayer packs its query, key and value into one in_proj "
                "weight, which no torch tensor-parallel plan splits by heads: use --model gpt"
            )
        if "Conv1D" in {type(m).__name__ for b in blocks for m in b.modules()}:
            return (
                "GPT-2's projections are transformers' Conv1D, which torch's tensor-parallel "
                "plans do not split: use a Llama-style hf: model or --model gpt"
            )
        return "no block has projections a tensor-parallel plan splits (attention and MLP Linears)"
    if degree == 1:
        return None
    for i, block, plan in planned:
        heads = heads_of(block, plan)
        if heads and heads % degree:
            return f"block {i} has {heads} attention heads, which {degree} ranks cannot share"
        modules = dict(block.named_modules())
        for name, split in plan.items():
            linear = modules[name]
            assert isinstance(linear, nn.Linear)
            width = linear.out_features if split == "colwise" else linear.in_features
            if width % degree:
                return f"block {i}'s {name} has width {width}, which {degree} ranks cannot share"
    return None


def check_split(blocks: list[nn.Module], degree: int) -> None:
    """Raise ConfigError where `degree`-way tensor parallelism cannot split the model."""
    if why := why_not_split(blocks, degree):
        raise ConfigError(why)
