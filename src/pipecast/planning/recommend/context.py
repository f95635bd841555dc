"""Costs of context parallelism (pipecast.runtime.context): what one of cp ranks splitting
each sequence computes, sends and holds.

Compute. A rank holds T/cp of each sequence's positions. The profile was measured on whole
sequences (length T), so a rank's block time is the profiled time scaled, assuming time in
proportion to FLOPs in each part of a block:

- the linear parts (projections, MLP, norms, embedding, head, the loss) touch each token
  once: 1/cp of their time;
- attention's quadratic part (scores and their weighted sum), a share
  q = T / (T + 12 d) of a GPT block's FLOPs (causal: 2 b T^2 d against the projections'
  and MLP's 24 b T d^2, d the model width); of a Llama block's, q = T / (T + 2 d +
  2 d_kv + 3 f) (its projections 2 b T (2 d^2 + 2 d d_kv), d_kv the keys' width, kv heads
  x head width; its SwiGLU's three matrices 6 b T d f, f the feed-forward width): with
  Llama 3's balanced chunks each rank has
  1/cp of the causal (query, key) pairs; a kernel that skips masked tiles (the profile's
  is_causal SDPA, FlashAttention with a block mask) computes just those, q/cp, and one that
  applies a dense boolean mask (pipecast's runtime: SDPA with attn_mask over its T/cp x T
  block) computes every pair of its block, twice as many: 2q/cp.

Communication. Each attention layer all-gathers the whole sequence's keys and values in the
forward, 2 x b x T x d_kv x bytes in all (d_kv the width where as many key/value
heads as heads) ((cp-1)/cp of it crossing the links), and
reduce-scatters their gradients in the backward, the same size; on the critical path, over
the context group of the stage's place (Layout's context axis: inside tensor x context ranks
on a node). The weights' gradients are all-reduced over every replica's context ranks.

Memory. Activations, stage outputs and what they hold scale by 1/cp, but for what the
runtime's attention saves for its backward beyond its share: the other ranks' keys and
values it gathered, (cp-1)/cp of the layer's, and its boolean mask, T/cp x T bytes.
"""

from __future__ import annotations

from dataclasses import replace

from pipecast.errors import ConfigError
from pipecast.planning.simulation.costs import Costs, plus_collectives
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.models.llama import default_ffn
from pipecast.values.parallel import Layout
from pipecast.values.partition import Partition
from pipecast.values.profile.types import BlockCost, BlockProfile, Profile

ATTENTION_BLOCKS = ("Block", "LlamaBlock")
"""Names of the blocks that hold one causal self-attention layer over the sequence (the zoo
GPT's transformer block, the zoo Llama's decoder layer)."""


def attention_share(seq_len: int, width: int, linear: int = 0) -> float:
    """The share of a block's FLOPs in attention's quadratic part: T / (T + `linear`),
    `linear` the block's linear FLOPs a token over 2 d (linear_width; 0: a GPT block's,
    12 d)."""
    return seq_len / (seq_len + (linear or 12 * width))


def block_scale(
    seq_len: int,
    width: int,
    degree: int,
    *,
    attention: bool,
    masked: bool = True,
    linear: int = 0,
) -> float:
    """The fraction of a block's whole-sequence time one of `degree` context ranks spends
    (the module's docstring): 1/cp for a block without attention; (1 - q)/cp + m q/cp with
    it, m = 2 under a dense mask (`masked`), 1 for a kernel that skips masked tiles."""
    if not attention:
        return 1 / degree
    q = attention_share(seq_len, width, linear)
    return ((1 - q) + (2 if masked else 1) * q) / degree


def splittable(profile: Profile) -> bool:
    """Whether `profile`'s model has causal attention over a sequence this module prices a
    split of (ATTENTION_BLOCKS, and the workload's sequence length and width)."""
    seq_len, width = profile.workload.get("seq_len"), profile.workload.get("width")
    attention = any(b.name in ATTENTION_BLOCKS for b in profile.blocks)
    return attention and isinstance(seq_len, int) and isinstance(width, int)


def _shape(profile: Profile) -> tuple[int, int]:
    """(sequence length, width) of `profile`'s model: a one-line error where it has no
    attention over a sequence to split."""
    if not splittable(profile):
        raise ConfigError(
            f"context parallelism splits the sequence of a model's causal attention, and the "
            f"profile of {profile.model} has none it can price (the zoo's gpt and llama "
            "have): leave context parallelism out"
        )
    return int(profile.workload["seq_len"]), int(profile.workload["width"])


def _llama(profile: Profile) -> bool:
    return any(b.name == "LlamaBlock" for b in profile.blocks)


def kv_width(profile: Profile) -> int:
    """The width of one token's keys (and of its values): the model width, or a Llama's
    key/value heads x its head width (grouped-query attention)."""
    _, width = _shape(profile)
    heads = profile.workload.get("heads")
    kv_heads = profile.workload.get("kv_heads") or heads
    if not (_llama(profile) and isinstance(heads, int) and heads and isinstance(kv_heads, int)):
        return width
    return width // heads * kv_heads


def linear_width(profile: Profile) -> int:
    """A block's linear FLOPs a token over 2 d (d the width): a GPT block's 12 d (four
    d x d projections, a 4 d MLP's two matrices), a Llama block's 2 d + 2 d_kv + 3 f."""
    _, width = _shape(profile)
    if not _llama(profile):
        return 12 * width
    ffn = profile.workload.get("ffn")
    f = ffn if isinstance(ffn, int) and ffn else default_ffn(width)
    return 2 * width + 2 * kv_width(profile) + 3 * f


def at_context_parallel(profile: Profile, degree: int, *, masked: bool = True) -> Profile:
    """The profile of one of `degree` context-parallel ranks (degree 1: this one): device
    times scaled by block_scale, the loss's by 1/cp, bytes that follow the tokens by 1/cp;
    host issue times and weights unchanged."""
    if degree == 1:
        return profile
    seq_len, width = _shape(profile)
    linear = linear_width(profile)
    if seq_len % (2 * degree):
        raise ConfigError(
            f"context parallelism over {degree} ranks cuts each sequence into 2 x {degree} "
            f"equal chunks, and the sequence length {seq_len} does not divide by "
            f"{2 * degree}: use a sequence length that does, or another degree"
        )

    def rank_block(b: BlockProfile, tensor: int = 1) -> BlockProfile:
        attention = b.name in ATTENTION_BLOCKS
        k = block_scale(seq_len, width, degree, attention=attention, masked=masked, linear=linear)
        costs = {}
        for mb, c in b.costs.items():
            gathered = kv_bytes(profile, mb) // tensor * (degree - 1) // degree
            mask = seq_len * seq_len // degree
            costs[mb] = _scaled(c, k, degree, (gathered + mask) if attention else 0)
        return replace(b, costs=costs)

    loss = {mb: (f / degree, b / degree) for mb, (f, b) in profile.loss.items()}
    split = {  # a tensor-parallel rank's blocks, each holding 1/t of the heads
        t: tuple(rank_block(b, t) for b in blocks) for t, blocks in profile.tensor_parallel.items()
    }
    blocks = tuple(rank_block(b) for b in profile.blocks)
    return replace(profile, blocks=blocks, loss=loss, tensor_parallel=split)


def _scaled(c: BlockCost, time: float, degree: int, kept: int) -> BlockCost:
    """`c` with its times scaled by `time`, its bytes by 1/`degree`, and `kept` bytes more
    saved for the backward."""
    return replace(
        c,
        forward=c.forward * time,
        backward_input=c.backward_input * time,
        backward_weight=c.backward_weight * time,
        batched_weight=c.batched_weight * time,
        backward=c.backward * time,
        graph_forward=c.graph_forward * time,
        graph_backward=c.graph_backward * time,
        output_bytes=c.output_bytes // degree,
        saved_bytes=c.saved_bytes // degree + kept,
        peak_bytes=c.peak_bytes // degree,
        held_bytes=c.held_bytes // degree,
    )


def kv_bytes(profile: Profile, micro_batch: int) -> int:
    """Bytes of one attention layer's keys and values over the whole sequence, what its
    all-gather assembles: 2 x b x T x d_kv x bytes per element (kv_width)."""
    seq_len, _ = _shape(profile)
    element = 4 if profile.dtype == "fp32" and not profile.autocast else 2
    return 2 * micro_batch * seq_len * kv_width(profile) * element


def cp_collectives(
    profile: Profile,
    start: int,
    stop: int,
    size: int,
    cluster: Cluster,
    group: tuple[int, ...],
    backward: bool = False,
    tensor: int = 1,
) -> float:
    """Seconds of the all-gathers of K and V (forward) or reduce-scatters of their
    gradients (`backward`) of blocks [start, stop) at micro-batch `size` over `group`, each
    of `tensor` tensor-parallel ranks gathering its heads' share."""
    if len(group) <= 1:
        return 0.0
    layers = sum(b.name in ATTENTION_BLOCKS for b in profile.blocks[start:stop])
    if not layers:
        return 0.0
    nbytes = kv_bytes(profile, size) // tensor
    each = (cluster.reduce_scatter_time if backward else cluster.allgather_time)(nbytes, group)
    return layers * each


def gradient_group(layout: Layout, rank: int) -> tuple[int, ...]:
    """The ranks that sum `rank`'s gradients: every replica's and every context rank's at
    its pipeline and tensor-parallel place, in rank order."""
    return tuple(sorted(r for c in layout.group("context", rank) for r in layout.group("data", c)))


def with_context_parallel(
    costs: Costs,
    profile: Profile,
    partition: Partition,
    size: int,
    cluster: Cluster,
    layout: Layout,
) -> Costs:
    """`costs` (from a context rank's profile, at_context_parallel) with each stage's K and V
    all-gathers on its forward and their gradients' reduce-scatters on the backward that
    passes the input gradient on, over the context group of replica 0's place of the stage,
    and the weights' all-reduce over every replica's context ranks (`layout`)."""
    if layout.context <= 1:
        return costs
    stages, allreduce = [], []
    for times, st in zip(costs.stages, partition.stages, strict=True):
        group = layout.group("context", st.devices[0])
        k = layout.tensor
        fwd = cp_collectives(profile, st.start, st.stop, size, cluster, group, tensor=k)
        bwd = cp_collectives(
            profile, st.start, st.stop, size, cluster, group, backward=True, tensor=k
        )
        stages.append(plus_collectives(times, fwd, bwd))
        ranks = gradient_group(layout, st.devices[0])
        allreduce.append(cluster.allreduce_time(times.param_bytes, ranks))
    return replace(costs, stages=tuple(stages), allreduce=tuple(allreduce))
