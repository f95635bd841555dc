"""Context parallelism's prices (planning/recommend/context.py) against hand-computed
numbers: a rank's compute, the K/V all-gathers on the context group's link, the gradients'
all-reduce over every replica's context ranks, and the memory a rank holds."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.planning.partition.test_partition import make_profile

from pipecast.errors import ConfigError
from pipecast.planning.partition.boundaries import layout_of
from pipecast.planning.recommend.context import (
    at_context_parallel,
    block_scale,
    cp_collectives,
    with_context_parallel,
)
from pipecast.planning.recommend.predict import predict
from pipecast.planning.simulation.pricing import costs_from_profile
from pipecast.values.hardware.presets import describe
from pipecast.values.partition import from_boundaries
from pipecast.values.profile.types import Profile
from pipecast.values.strategy import Strategy

SEQ, WIDTH, MB = 1024, 256, 8
KV = 2 * MB * SEQ * WIDTH * 4  # one layer's K and V over the sequence, fp32: 16 MiB


def _gpt() -> Profile:
    """Embedding, two transformer blocks, head: 1 ms forward each, at 8; each transformer
    block saves 128 MB (its K and V alone are 16 MiB), the others 16 MB."""
    saved = [16_000_000, 128_000_000, 128_000_000, 16_000_000]
    profile = make_profile([1e-3] * 4, saved=saved, out_bytes=[2_000_000] * 4)
    names = ("Embedding", "Block", "Block", "Head")
    blocks = tuple(replace(b, name=n) for b, n in zip(profile.blocks, names, strict=True))
    workload = {"seq_len": SEQ, "width": WIDTH}
    return replace(profile, blocks=blocks, workload=workload, loss={MB: (1e-3, 2e-3)})


def test_a_rank_computes_its_tokens_and_its_share_of_the_causal_pairs() -> None:
    """T = 1024, d = 256: attention's quadratic part is 1024 / (1024 + 3072) = 1/4 of a
    block. Over 2 ranks: 3/4 / 2 of the linear part, and 1/4 / 2 of the pairs, twice
    over under a dense mask: 0.625 (0.5 with a kernel that skips masked tiles)."""
    assert block_scale(SEQ, WIDTH, 2, attention=True) == pytest.approx(0.625)
    assert block_scale(SEQ, WIDTH, 2, attention=True, masked=False) == pytest.approx(0.5)
    assert block_scale(SEQ, WIDTH, 2, attention=False) == pytest.approx(0.5)
    rank = at_context_parallel(_gpt(), 2)
    forwards = [rank.cost(i, MB).forward for i in range(4)]
    assert forwards == pytest.approx([0.5e-3, 0.625e-3, 0.625e-3, 0.5e-3])
    assert rank.loss[MB] == pytest.approx((0.5e-3, 1e-3))  # the loss over half the tokens
    # memory: half the activations and outputs; an attention block also keeps the other
    # rank's K and V it gathered (half the layer's) and its mask, 1024 x 512 booleans
    saved = [rank.cost(i, MB).saved_bytes for i in range(4)]
    kept = KV // 2 + SEQ * SEQ // 2
    assert saved == [8_000_000, 64_000_000 + kept, 64_000_000 + kept, 8_000_000]
    assert rank.cost(0, MB).output_bytes == 1_000_000


def test_the_keys_and_values_are_gathered_on_the_context_groups_link() -> None:
    """Two nodes of 2 GPUs, 2 replicas x CP x2: each replica's context group (0, 1) sits in
    a node (10 us, 150 GB/s: half a ring all-reduce, 10 us + 1/2 x 16 MiB / 150 GB/s),
    once per attention layer each way; the gradients are all-reduced over all 4 ranks,
    across the nodes."""
    profile = _gpt()
    one = 10e-6 + 0.5 * KV / 150e9
    strategy = Strategy(kind="data", replicas=2, cp=2)
    layout = layout_of(strategy)
    assert layout.group("context", 0) == (0, 1)
    part = from_boundaries([0, 4], replicas=2, tp=2)  # a place is 2 ranks wide
    assert part.stages[0].devices == (0, 2)
    for inter in ("50GB/s", "1GB/s"):  # the link between nodes prices no K/V traffic
        cluster = describe(gpus_per_node=2, nodes=2, memory="80GiB", inter_bandwidth=inter)
        assert cp_collectives(profile, 0, 4, MB, cluster, (0, 1)) == pytest.approx(2 * one)
        rank = at_context_parallel(profile, 2)
        costs = costs_from_profile(rank, part, MB, cluster)
        priced = with_context_parallel(costs, profile, part, MB, cluster, layout)
        [before], [after] = costs.stages, priced.stages
        assert after.forward - before.forward == pytest.approx(2 * one)
        assert after.backward - before.backward == pytest.approx(2 * one)
        assert priced.allreduce == (cluster.allreduce_time(before.param_bytes, range(4)),)


def test_predict_places_and_prices_a_context_parallel_strategy() -> None:
    """2 stages x CP x2 x TP x2 on 2 nodes of 4: stage 1 on rank 4, the next node; CP x2
    holds less and computes faster than the same pipeline on whole sequences."""
    cluster = describe(gpus_per_node=4, nodes=2, memory="80GiB")
    profile = _gpt()
    with_tp = Strategy(kind="pipeline", stages=2, cp=2, tp=2, microbatches=2)
    assert with_tp.gpus == 8 and "CP x2 x TP x2" in with_tp.label()
    assert layout_of(with_tp).group("context", 4) == (4, 6)
    plain = Strategy(kind="pipeline", stages=2, microbatches=2)
    split = replace(plain, cp=2)
    a, b = (predict(profile, cluster, s, 16) for s in (plain, split))
    assert b.partition.stages[1].devices == (2,)
    assert b.timeline.step_time < a.timeline.step_time
    assert max(b.timeline.peak_memory) < max(a.timeline.peak_memory)


def test_a_sequence_without_attention_or_that_does_not_cut_is_refused() -> None:
    with pytest.raises(ConfigError, match="does not divide by 6"):
        at_context_parallel(_gpt(), 3)
    plain = make_profile([1e-3] * 2)
    with pytest.raises(ConfigError, match="has none it can price"):
        at_context_parallel(plain, 2)


def test_a_llama_rank_computes_by_its_own_shape_and_gathers_its_kv_heads() -> None:
    """Llama 3.1 8B's shape at 32K tokens: d = 4096, 32 heads over 8 key/value heads
    (d_kv = 1024), f = 14336. A block's linear FLOPs a token over 2 d: 2 x 4096 + 2 x 1024
    + 3 x 14336 = 53248, so attention's quadratic part is 32768 / 86016 of it; over 2 ranks
    under a dense mask a block takes (1 + q) / 2 of its time. Its K and V are a quarter of
    the width: 2 x 8 x 32768 x 1024 x 4 bytes a layer."""
    seq, width = 32768, 4096
    base = _gpt()
    names = ("LlamaEmbedding", "LlamaBlock", "LlamaBlock", "LlamaHead")
    blocks = tuple(replace(b, name=n) for b, n in zip(base.blocks, names, strict=True))
    workload = {"model": "llama", "seq_len": seq, "width": width, "heads": 32}
    profile = replace(base, blocks=blocks, workload={**workload, "kv_heads": 8, "ffn": 14336})
    q = seq / (seq + 53248)
    rank = at_context_parallel(profile, 2)
    assert rank.cost(1, MB).forward == pytest.approx(1e-3 * (1 + q) / 2)
    assert rank.cost(0, MB).forward == pytest.approx(0.5e-3)
    kv = 2 * MB * seq * 1024 * 4
    assert rank.cost(1, MB).saved_bytes == 64_000_000 + kv // 2 + seq * seq // 2
    # no ffn given: the zoo Llama's default, 8/3 d rounded up to 256 (11008 at 4096),
    # and as many key/value heads as heads
    plain = replace(profile, workload=workload)
    assert at_context_parallel(plain, 2).cost(1, MB).saved_bytes == (
        64_000_000 + 2 * MB * seq * width * 4 // 2 + seq * seq // 2
    )
    q_plain = seq / (seq + 2 * width + 2 * width + 3 * 11008)
    assert at_context_parallel(plain, 2).cost(1, MB).forward == pytest.approx(
        1e-3 * (1 + q_plain) / 2
    )
