"""The zoo's Llama (values/models/llama.py) against Hugging Face's LlamaForCausalLM with the
same weights, Meta's published parameter count, and tensor parallelism's whole-head plan."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from pipecast.errors import ConfigError
from pipecast.values.models.llama import default_ffn
from pipecast.values.models.tensor_plans import ZOO_LLAMA, heads_of, plan_of, why_not_split
from pipecast.values.models.workload import Workload

SMALL = Workload(
    model="llama",
    dataset="tokens",
    seq_len=8,
    vocab=64,
    width=32,
    layers=2,
    heads=4,
    kv_heads=2,
    ffn=48,
)
LLAMA_8B = Workload(
    model="llama",
    dataset="tokens",
    seq_len=8192,
    vocab=128256,
    width=4096,
    layers=32,
    heads=32,
    kv_heads=8,
    ffn=14336,
)


def _hf_twin(blocks: nn.Sequential) -> nn.Module:
    """Hugging Face's LlamaForCausalLM at SMALL's sizes holding `blocks`' weights."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=SMALL.vocab,
        hidden_size=SMALL.width,
        intermediate_size=SMALL.ffn,
        num_hidden_layers=SMALL.layers,
        num_attention_heads=SMALL.heads,
        num_key_value_heads=SMALL.kv_heads,
        max_position_embeddings=SMALL.seq_len,
        rms_norm_eps=1e-5,
        rope_theta=500_000.0,
        tie_word_embeddings=False,
    )
    hf = transformers.LlamaForCausalLM(config).eval()
    ours = {
        "model.embed_tokens": blocks[0].token,
        "model.norm": blocks[-1].norm,
        "lm_head": blocks[-1].out,
    }
    for i, layer in enumerate(blocks[1:-1]):
        hf_names = {
            "input_layernorm": "attn_norm",
            "post_attention_layernorm": "mlp_norm",
            "self_attn.q_proj": "attn.q",
            "self_attn.k_proj": "attn.k",
            "self_attn.v_proj": "attn.v",
            "self_attn.o_proj": "attn.proj",
            "mlp.gate_proj": "mlp.w1",
            "mlp.up_proj": "mlp.w3",
            "mlp.down_proj": "mlp.w2",
        }
        for theirs, mine in hf_names.items():
            ours[f"model.layers.{i}.{theirs}"] = layer.get_submodule(mine)
    with torch.no_grad():
        for name, module in ours.items():
            hf.get_submodule(name).weight.copy_(module.weight)
    return hf


def test_logits_match_hugging_faces_llama_with_the_same_weights() -> None:
    """Embedding, RMSNorm, grouped-query attention with rotary positions (Llama 3's base
    500,000), SwiGLU and the head, all at once: the same logits as transformers' Llama."""
    torch.manual_seed(0)
    blocks = SMALL.build()
    hf = _hf_twin(blocks)
    ids = torch.randint(0, SMALL.vocab, (3, SMALL.seq_len))
    with torch.no_grad():
        torch.testing.assert_close(blocks(ids), hf(input_ids=ids).logits, rtol=1e-4, atol=1e-5)


def test_llama_3_1_8b_has_metas_parameter_count() -> None:
    """8,030,261,248 parameters: the embedding and the head V h each, a layer's q and o h^2
    each, k and v h x 1024 (8 heads of 128) each, three h x 14336 MLP matrices and two
    norms of h, and the final norm."""
    h, v, kv, ffn, layers = 4096, 128256, 8 * 128, 14336, 32
    layer = 2 * h * h + 2 * h * kv + 3 * h * ffn + 2 * h
    assert 2 * v * h + layers * layer + h == 8_030_261_248
    assert sum(p.numel() for p in LLAMA_8B.build("meta").parameters()) == 8_030_261_248


def test_the_default_ffn_is_llamas_two_thirds_of_four_widths() -> None:
    """Llama 2 7B's 11008 at width 4096: 8/3 x 4096 rounded up to a multiple of 256."""
    assert default_ffn(4096) == 11008
    blocks = Workload(model="llama", dataset="tokens", width=4096, layers=1).build("meta")
    assert blocks[1].mlp.w1.out_features == 11008


def test_key_value_heads_that_do_not_divide_the_heads_are_refused() -> None:
    with pytest.raises(ConfigError, match="heads 8 must be divisible by key/value heads 3"):
        Workload(model="llama", dataset="tokens", heads=8, kv_heads=3).build("meta")


def test_tensor_parallelism_plans_whole_heads() -> None:
    """The 8B's layer: q, k, v and w1, w3 column-wise, proj and w2 row-wise; 32 query and 8
    key/value heads, so 8 ranks share it and 16 cannot."""
    block = LLAMA_8B.build("meta")[1]
    plan = plan_of(block)
    assert plan == ZOO_LLAMA
    assert heads_of(block, plan) == (32, 8)
    blocks = list(LLAMA_8B.build("meta"))
    assert why_not_split(blocks, 8) is None
    assert why_not_split(blocks, 16) == (
        "block 1 has 8 key/value heads (grouped-query attention, 32 query heads), which 16 "
        "ranks cannot share: use a tensor-parallel degree that divides 8"
    )


def _rank(block: nn.Module, degree: int, rank: int) -> nn.Module:
    """A copy of `block` holding `rank`'s rows of each column-wise projection and columns
    of each row-wise one, as ColwiseParallel and RowwiseParallel shard them."""
    local = copy.deepcopy(block)
    for name, split in ZOO_LLAMA.items():
        owner, _, attr = name.rpartition(".")
        whole = local.get_submodule(name)
        assert isinstance(whole, nn.Linear)
        rows = whole.weight.detach().chunk(degree, dim=0 if split == "colwise" else 1)[rank]
        share = nn.Linear(rows.shape[1], rows.shape[0], bias=False)
        share.weight = nn.Parameter(rows.clone())
        setattr(local.get_submodule(owner), attr, share)
    return local


def test_ranks_shares_of_a_layer_sum_to_the_layer() -> None:
    """2 ranks each hold 2 query heads and the key/value head they share; each rank's
    layer adds the residual to its share of the attention's and the MLP's outputs, so
    with the residuals' extra copies taken out the shares sum to the layer. One
    sub-layer at a time: the MLP reads the summed attention output."""
    torch.manual_seed(1)
    layer = SMALL.build()[1]
    x = torch.randn(3, SMALL.seq_len, SMALL.width)
    shares = [_rank(layer, 2, r) for r in range(2)]
    with torch.no_grad():
        attn = sum(s.attn(layer.attn_norm(x)) for s in shares)
        torch.testing.assert_close(attn, layer.attn(layer.attn_norm(x)), rtol=1e-5, atol=1e-6)
        h = x + attn
        mlp = sum(s.mlp(layer.mlp_norm(h)) for s in shares)
        torch.testing.assert_close(mlp, layer.mlp(layer.mlp_norm(h)), rtol=1e-5, atol=1e-6)
