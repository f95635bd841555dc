"""recommend offers context parallelism by context_degrees.py's rule, and prices each such
strategy as predict() prices the same Strategy built by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.planning.recommend.test_context_pricing import _gpt

from pipecast.orchestration.recommend.validate import job_for
from pipecast.planning.recommend.context_degrees import context_degrees
from pipecast.planning.recommend.predict import predict
from pipecast.planning.recommend.rank import recommend
from pipecast.runtime.config import RunConfig
from pipecast.values.hardware.presets import describe
from pipecast.values.models import Workload
from pipecast.values.profile.types import BlockCost, Profile
from pipecast.values.strategy import Strategy

CLUSTER = describe(gpus_per_node=8, nodes=1, memory="80GiB")


def _longer(c: BlockCost, k: float) -> BlockCost:
    return replace(
        c,
        forward=c.forward * k,
        backward_input=c.backward_input * k,
        backward_weight=c.backward_weight * k,
        backward=c.backward * k,
    )


def _at(seq_len: int, *, llama: bool = False) -> Profile:
    """test_context_pricing's GPT profile (width 256, on a GPU) at `seq_len` tokens; with
    `llama`, its blocks named as the zoo Llama's, at Llama 3.1 8B's shape, and 500 times
    as long (62 ms a 32K-token sequence's forward through a block: an H100's order)."""
    profile = _gpt()
    if not llama:
        return replace(profile, workload={"seq_len": seq_len, "width": 256})
    names = ("LlamaEmbedding", "LlamaBlock", "LlamaBlock", "LlamaHead")
    blocks = tuple(
        replace(b, name=n, costs={s: _longer(c, 500) for s, c in b.costs.items()})
        for b, n in zip(profile.blocks, names, strict=True)
    )
    workload = {"model": "llama", "seq_len": seq_len, "width": 4096, "heads": 32}
    return replace(profile, blocks=blocks, workload={**workload, "kv_heads": 8, "ffn": 14336})


@pytest.mark.parametrize(
    ("profile", "degrees"),
    [
        # T = 4096, d = 256: attention is 4096 / (4096 + 3072) of a block
        (_at(4096), (2, 4, 8)),
        # T = 32768 on Llama 8B's shape: 32768 / (32768 + 53248)
        (_at(32768, llama=True), (2, 4, 8)),
    ],
)
def test_a_long_sequence_is_split_and_priced_as_predict_prices_it(
    profile: Profile, degrees: tuple[int, ...]
) -> None:
    """Two sequences on 8 GPUs: data parallelism uses 2 of them, a split sequence all 8;
    the fastest is context parallel, and every CP strategy ranked is priced exactly as
    predict() prices the Strategy written out by hand; none is refused."""
    assert context_degrees(profile, 8) == degrees
    rec = recommend(profile, CLUSTER, 2, optimizer="adam")
    split = [p for p in rec.ranked if p.strategy.cp > 1]
    assert {p.strategy.cp for p in split} == set(degrees)
    assert rec.best.strategy.cp > 1
    # everything fits here: a CP strategy refused is one predict cannot price (FSDP
    # beside CP) or one on more GPUs than there are
    assert not [r for r in rec.rejected if r.strategy.cp > 1]
    by_hand = [
        Strategy(kind="data", replicas=2, cp=4),
        Strategy(kind="single", replicas=1, cp=8, microbatches=2),
        Strategy(kind="pipeline", stages=2, cp=4, schedule="1f1b", microbatches=2),
    ]
    ranked = {p.strategy: p for p in split}
    for strategy in by_hand:
        assert strategy in ranked, strategy.label()
        alone = predict(profile, CLUSTER, strategy, 2, optimizer="adam")
        assert ranked[strategy].step_time == alone.step_time
        assert ranked[strategy].peak_memory == alone.peak_memory
    for p in split:  # what the runtime runs with CP: whole copies, no TP, eagerly
        s = p.strategy
        assert (s.shard, s.tp, s.cuda_graphs, s.shard_optimizer, s.offload) == (
            "none",
            1,
            False,
            False,
            "none",
        )


@pytest.mark.parametrize(
    ("seq_len", "degrees"),
    [
        (1024, (2, 4, 8)),  # T = 4 d: attention a quarter of the block, split
        (1008, ()),  # 1008 / 4080 < 1/4: not split, though 1008 cuts into 4 and 8 chunks
        (512, ()),
        (1032, (2, 4)),  # long enough, but 1032 does not cut into 16 equal chunks
    ],
)
def test_a_sequence_is_split_only_where_attention_is_a_quarter_of_a_block(
    seq_len: int, degrees: tuple[int, ...]
) -> None:
    """context_degrees' rule: attention's quadratic part at least 1/4 of a block's FLOPs
    (T >= 4 d for a GPT block, d = 256 here), and 2 c equal chunks; recommend lists CP
    strategies of exactly those degrees, at any batch."""
    profile = _at(seq_len)
    assert context_degrees(profile, 8) == degrees
    assert context_degrees(profile, 4) == tuple(c for c in degrees if c <= 4)
    for batch in (2, 16):
        rec = recommend(profile, CLUSTER, batch, optimizer="adam")
        assert {p.strategy.cp for p in rec.ranked} - {1} == set(degrees)


def test_a_model_without_attention_is_never_split() -> None:
    plain = replace(_gpt(), blocks=tuple(replace(b, name="b") for b in _gpt().blocks))
    assert context_degrees(plain, 8) == ()


def test_measuring_a_recommendation_splits_its_sequences() -> None:
    """--validate measures the strategy that was priced: its job runs CP x4."""
    strategy = Strategy(kind="data", replicas=2, cp=4)
    pred = predict(_at(4096), CLUSTER, strategy, 2, optimizer="adam")
    workload = Workload(model="gpt", dataset="tokens", seq_len=4096, width=256, layers=2)
    job = job_for(pred, workload, device="cpu", config=RunConfig())
    assert (job.cp, job.replicas) == (4, 2)
