"""Which of a block's projections tensor parallelism splits, and how (Megatron's plan).

In attention the query, key and value projections split column-wise (each rank computes its
own heads) and the output projection row-wise (each rank's heads' share, summed across the
ranks); in the MLP the first projection splits column-wise and the second row-wise. A block's
forward then needs one all-reduce after attention and one after the MLP (one per row-wise
projection), and its backward one per column-wise projection (torch's ColwiseParallel
all-reduces each one's input gradient on its own): four in GPT's (q, k, v, MLP-in). The
runtime hands the plan to torch's parallelize_module; the profiler times a block at its
sharded shapes from the same plan.

A captured model's blocks (an `hf:` Llama, Mistral or Qwen2) hold the same projections as
nn.Linear modules (graph_linears) under the model's own paths, a decoder layer cut into its
attention and its MLP halves; their graphs' shape literals along the split heads are made
one rank's (graph_split), and a graph the split cannot be traced through is refused in one
line, naming the operation.
"""

from __future__ import annotations

from typing import Literal

from torch import fx, nn

from pipecast.errors import ConfigError
from pipecast.values.models.graph_split import Trace, Unfollowable, follow, make_local

Split = Literal["colwise", "rowwise"]
Plan = dict[str, Split]

GPT_ATTENTION: Plan = {
    "attn.q": "colwise",
    "attn.k": "colwise",
    "attn.v": "colwise",
    "attn.proj": "rowwise",
}
GPT_MLP: Plan = {"mlp.up": "colwise", "mlp.down": "rowwise"}
GPT: Plan = {**GPT_ATTENTION, **GPT_MLP}
"""The zoo's GPT block (values/models/gpt.py)."""
SWIGLU_MLP: Plan = {"mlp.w1": "colwise", "mlp.w3": "colwise", "mlp.w2": "rowwise"}
ZOO_LLAMA: Plan = {**GPT_ATTENTION, **SWIGLU_MLP}
"""The zoo's Llama block (values/models/llama.py): GPT's attention names, torchtitan's MLP
names."""

LLAMA_ATTENTION: Plan = {
    "self_attn.q_proj": "colwise",
    "self_attn.k_proj": "colwise",
    "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise",
}
LLAMA_MLP: Plan = {
    "mlp.gate_proj": "colwise",
    "mlp.up_proj": "colwise",
    "mlp.down_proj": "rowwise",
}
LLAMA: Plan = {**LLAMA_ATTENTION, **LLAMA_MLP}
"""A Llama-style decoder layer (Hugging Face's names: Llama, Mistral, Qwen2)."""

PARTS = (GPT_ATTENTION, GPT_MLP, SWIGLU_MLP, LLAMA_ATTENTION, LLAMA_MLP)
"""Each closed by one all-reduce. A block holds whole parts, under any path: a captured
decoder layer (values/models/capture.py) falls into its attention half and its MLP half,
each under the model's own path ('body.model.model.layers.0.self_attn.q_proj')."""

FALLBACK_REDUCES = (2, 4)
"""All-reduces of a planned block's output per forward and per backward where a profile did
not record its block's own (BlockProfile.tp_reduces): the zoo's GPT block's, as torch runs
them, 2 forward (its row-wise projections' outputs) and 4 backward (its column-wise ones'
input gradients: q, k, v, MLP-in)."""

_ATTENTION_INPUTS = {"q", "k", "v", "q_proj", "k_proj", "v_proj"}


def plan_of(block: nn.Module) -> Plan | None:
    """The plan of every part `block` has, each projection an nn.Linear, by the projections'
    paths in `block`; None: it has none."""
    modules = dict(block.named_modules())
    plan: Plan = {}
    for part in PARTS:
        anchor = next(iter(part))
        for name in modules:
            if name != anchor and not name.endswith(f".{anchor}"):
                continue
            prefix = name.removesuffix(anchor)
            if all(isinstance(modules.get(prefix + p), nn.Linear) for p in part):
                plan.update({prefix + p: split for p, split in part.items()})
    return plan or None


def _graph(block: nn.Module) -> fx.GraphModule | None:
    """A captured block's graph (GraphBlock.body); None for a module's own forward."""
    body = getattr(block, "body", None)
    return body if isinstance(body, fx.GraphModule) else None


def split_of(block: nn.Module, plan: Plan) -> Trace | None:
    """The split dimension through a captured block's graph (graph_split.follow; it raises
    Unfollowable), None for a block that is no graph."""
    body = _graph(block)
    if body is None:
        return None
    paths = {name.removeprefix("body."): split for name, split in plan.items()}
    colwise = {p for p, split in paths.items() if split == "colwise"}
    return follow(body.graph, colwise, set(paths) - colwise)


def heads_of(block: nn.Module, plan: Plan, split: Trace | None = None) -> tuple[int, int]:
    """(query heads, key/value heads) of a planned block's attention, 0 where unknown or it
    has none: a projection's width over the attention's `head_dim`, or, in a captured
    block, the heads its graph views the projection's output as (`split`)."""
    modules = dict(block.named_modules())
    counts: dict[str, int] = {}
    for name in plan:
        owner, _, leaf = name.rpartition(".")
        if leaf not in _ATTENTION_INPUTS:
            continue
        linear = modules[name]
        assert isinstance(linear, nn.Linear)
        head_dim = getattr(modules[owner], "head_dim", 0)
        if isinstance(head_dim, int) and head_dim:
            counts[leaf[0]] = linear.out_features // head_dim
        elif split is not None:
            counts[leaf[0]] = split.heads.get(name.removeprefix("body."), 0)
    return counts.get("q", 0), counts.get("k", 0)


def local_shapes(block: nn.Module, plan: Plan, degree: int) -> None:
    """A captured block's shape literals along the split dimension one of `degree` ranks'
    share (graph_split.make_local); nothing for a module's own forward, which views its
    heads with -1."""
    body = _graph(block)
    split = split_of(block, plan)
    if body is None or split is None or degree == 1:
        return
    make_local(body.graph, split, degree)
    body.recompile()


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
        if any(_is_conv1d(name, m) for b in blocks for name, m in b.named_modules()):
            return (
                "GPT-2's projections are transformers' Conv1D, which torch's tensor-parallel "
                "plans do not split: use a Llama-style hf: model or --model gpt"
            )
        return _cut_apart(blocks) or (
            "no block has projections a tensor-parallel plan splits (attention and MLP Linears)"
        )
    if degree == 1:
        return None
    for i, block, plan in planned:
        if why := _why_not_block(block, plan, degree):
            return f"block {i} {why}"
    return None


def _why_not_block(block: nn.Module, plan: Plan, degree: int) -> str | None:
    try:
        split = split_of(block, plan)
    except Unfollowable as exc:
        return f"cannot be split by its projections: {exc}"
    heads, kv_heads = heads_of(block, plan, split)
    if heads and heads % degree:
        return (
            f"has {heads} attention heads, which {degree} ranks cannot share: use a "
            "tensor-parallel degree that divides them"
        )
    if kv_heads and kv_heads != heads and kv_heads % degree:
        return (
            f"has {kv_heads} key/value heads (grouped-query attention, {heads} query heads), "
            f"which {degree} ranks cannot share: use a tensor-parallel degree that divides "
            f"{kv_heads}"
        )
    modules = dict(block.named_modules())
    for name, split_as in plan.items():
        linear = modules[name]
        assert isinstance(linear, nn.Linear)
        width = linear.out_features if split_as == "colwise" else linear.in_features
        if width % degree:
            return f"has {name} of width {width}, which {degree} ranks cannot share"
    return split.why_not(degree) if split is not None else None


def _cut_apart(blocks: list[nn.Module]) -> str | None:
    """Where capture put one part's projections in different blocks: which, and the way out."""
    for i, block in enumerate(blocks):
        if _graph(block) is None:
            continue
        modules = dict(block.named_modules())
        for name, part in ((n, p) for n in modules for p in PARTS):
            key = next((k for k in part if name.endswith(f".{k}")), None)
            if key is None or not isinstance(modules[name], nn.Linear):
                continue
            prefix = name.removesuffix(key)
            missing = [k for k in part if not isinstance(modules.get(prefix + k), nn.Linear)]
            if not missing:
                continue
            owner = name.removeprefix("body.").rpartition(".")[0]
            return (
                f"the capture cut {owner}'s projections into different blocks (block {i} "
                f"holds {key}, not {missing[0]}): tensor parallelism needs each attention and "
                "MLP whole in one block; use more layers (capture then cuts between them) or "
                "a factory that returns an nn.Sequential of whole blocks"
            )
    return None


def _is_conv1d(name: str, module: nn.Module) -> bool:
    """GPT-2's transformers Conv1D, as a module or captured (its fused `c_attn`)."""
    return type(module).__name__ == "Conv1D" or name.endswith("attn.c_attn")


def check_split(blocks: list[nn.Module], degree: int) -> None:
    """Raise ConfigError where `degree`-way tensor parallelism cannot split the model."""
    if why := why_not_split(blocks, degree):
        raise ConfigError(why)
