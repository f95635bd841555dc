"""The profiler's reading of what a block keeps under selective recomputation
(measuring/profiler/selective.py), against a count by hand of the tensors it keeps."""

from __future__ import annotations

from pipecast.measuring.profiler.profiler import ProfileOptions, profile_model
from pipecast.values.models import Workload

GPT = Workload(model="gpt", dataset="tokens", seq_len=8, vocab=64, width=32, layers=2, heads=4)


def test_a_gpt_block_keeps_its_products_and_attention_outputs() -> None:
    """Micro-batch 4 of 8 tokens, width 32, 4 heads, fp32: a transformer block keeps q, k,
    v, the attention's projection and the MLP's down (32 wide each), the MLP's up (128),
    the attention's output (32) and its log-sum-exp (one per head): 324 floats a token, for
    32 tokens; less than all it saves. The embedding keeps no product's output, and the
    head's one product is its output, which the next stage holds."""
    options = ProfileOptions(micro_batch_sizes=(4,), warmup=0, repeats=1)
    profile = profile_model(GPT.build(), GPT.spec, options)
    kept = [b.costs[4].selective_bytes for b in profile.blocks]
    tokens = 4 * 8
    assert kept == [0, tokens * 324 * 4, tokens * 324 * 4, 0]
    for block in profile.blocks[1:3]:
        selective = block.costs[4].selective_bytes
        assert selective is not None and selective < block.costs[4].saved_bytes
