"""The profiler times each planned block at the shapes one tensor-parallel rank computes."""

from __future__ import annotations

import pytest

from pipecast.errors import ConfigError
from pipecast.measuring.profiler.profiler import ProfileOptions, profile_model
from pipecast.measuring.profiler.tensor_parallel import sharded_model
from pipecast.values.models import Workload

GPT = Workload(model="gpt", dataset="tokens", seq_len=8, vocab=64, width=32, layers=2, heads=4)
LLAMA = Workload(model="tests.user_models:small_llama", dataset="tokens", seq_len=8, vocab=64)


def test_a_planned_block_is_profiled_at_one_ranks_share() -> None:
    """Width 32, 2 ranks: q, k and v keep 16 of 32 outputs (32 x 16 weights + 16 biases
    each), the output projection 16 of 32 inputs (16 x 32 + the whole 32-bias), the MLP 64
    of 128 hidden (32 x 64 + 64, then 64 x 32 + 32), the two LayerNorms whole (2 x 64): a
    transformer block's rank holds 3 x 528 + 544 + 2112 + 2080 + 128 = 6448 weights. The
    embedding and the head have no plan and stay whole."""
    options = ProfileOptions(micro_batch_sizes=(2,), warmup=0, repeats=1, tensor_parallel=(2,))
    profile = profile_model(GPT.build(), GPT.spec, options, model_name="gpt")
    rank = profile.at_tensor_parallel(2)
    assert [b.params for b in rank.blocks[1:3]] == [6448, 6448]
    assert rank.blocks[0] == profile.blocks[0] and rank.blocks[3] == profile.blocks[3]
    assert rank.blocks[1].costs[2].forward > 0
    # all-reduces: the 2 row-wise outputs forward, the 4 column-wise inputs' gradients back
    assert [b.tp_reduces for b in rank.blocks] == [None, (2, 4), (2, 4), None]
    with pytest.raises(ConfigError, match="degree 4"):
        profile.at_tensor_parallel(4)


def test_a_captured_llamas_halves_are_profiled_at_one_ranks_share() -> None:
    """Width 32, 4 query heads and 2 key/value heads of 8, 2 ranks. The attention half keeps
    16 of the query's 32 outputs (16 x 32), 8 of the key's and the value's 16 (8 x 32 each),
    16 of the output projection's 32 inputs (32 x 16) and its whole norm (32): 1568 of its
    3104 weights. The MLP half keeps 32 of the gate's and up's 64 outputs and of down's 64
    inputs (3 x 1024) and its norm: 3104 of 6176. Timing it runs the block's graph at one
    rank's head counts (repeat_kv's literals made one rank's)."""
    options = ProfileOptions(micro_batch_sizes=(2,), warmup=0, repeats=1, tensor_parallel=(2,))
    profile = profile_model(LLAMA.build(), LLAMA.spec, options, model_name="llama")
    rank = profile.at_tensor_parallel(2)
    assert [b.params for b in profile.blocks[1:5]] == [3104, 6176] * 2
    assert [b.params for b in rank.blocks[1:5]] == [1568, 3104] * 2
    assert rank.blocks[0] == profile.blocks[0] and rank.blocks[5:] == profile.blocks[5:]
    assert rank.blocks[1].costs[2].forward > 0
    # attention: o_proj forward, q, k and v back; MLP: down forward, gate and up back
    assert [b.tp_reduces for b in rank.blocks[1:5]] == [(1, 3), (1, 2)] * 2


def test_a_model_no_plan_splits_is_refused() -> None:
    stack = Workload(model="transformer", dataset="embeddings", seq_len=8, width=32, layers=2)
    with pytest.raises(ConfigError, match="in_proj"):
        sharded_model(stack.build(), 2)
    with pytest.raises(ConfigError, match="4 attention heads"):
        sharded_model(GPT.build(), 8)
