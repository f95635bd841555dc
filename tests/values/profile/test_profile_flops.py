"""Forward FLOPs per block, against closed forms worked out by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from pipecast.values.data.spec import DatasetSpec
from pipecast.values.models.workload import Workload
from pipecast.values.profile.flops import counted, forward_flops, with_forward_flops, workload_flops
from pipecast.values.profile.reference import shipped
from pipecast.values.profile.types import Profile


def _vectors(width: int) -> DatasetSpec:
    return DatasetSpec(
        name="vectors",
        input_kind="embeddings",
        sample_shape=(width,),
        target="regression",
        num_classes=0,
    )


@pytest.mark.parametrize(("k", "n", "b"), [(3, 5, 1), (64, 48, 7), (128, 10, 32)])
def test_a_linear_takes_two_flops_per_multiply_add(k: int, n: int, b: int) -> None:
    """nn.Linear(k, n) on b rows is b x k x n multiply-adds: 2 b k n FLOPs (the bias's adds
    are not counted, as the convention leaves out elementwise work)."""
    assert forward_flops([nn.Linear(k, n)], _vectors(k), batch=b) == (2 * b * k * n,)


def test_a_convolution_counts_every_output_position() -> None:
    """Conv2d(3, 8, 5) on 32 x 32: 28 x 28 outputs x 8 channels, each 3 x 5 x 5 multiply-adds."""
    spec = DatasetSpec(
        name="img", input_kind="image", sample_shape=(3, 32, 32), target="class", num_classes=10
    )
    assert forward_flops([nn.Conv2d(3, 8, 5), nn.ReLU()], spec) == (2 * 28 * 28 * 8 * 3 * 25, 0)


def test_gpt_blocks_match_megatrons_closed_form() -> None:
    """Narayanan et al. (SC21), appendix: a layer's forward is 24 s h^2 + 4 s^2 h FLOPs per
    sequence (q, k, v, the projection and a 4h MLP; q k^T and the scores times v, counted
    whole under the causal mask); the head is 2 s h V, the embedding's lookup none."""
    s, h, v, layers = 64, 32, 50, 3
    w = Workload(model="gpt", dataset="tokens", seq_len=s, vocab=v, width=h, layers=layers, heads=4)
    counts = forward_flops(list(w.build("meta")), w.spec)
    layer = 24 * s * h * h + 4 * s * s * h
    assert counts == (0, *[layer] * layers, 2 * s * h * v)
    # and the sum is a third of Megatron-LM's model FLOPs, 72 l s h^2 (1 + s/6h + V/12lh)
    assert sum(counts) == pytest.approx(
        24 * layers * s * h * h * (1 + s / (6 * h) + v / (12 * layers * h))
    )


def test_llama_3_1_8b_counts_swiglu_and_grouped_query_attention() -> None:
    """Llama 3.1 8B at 8192 tokens, by hand: a layer's q and o are 2 s h^2 each, k and v
    (8 key/value heads of 128) 2 s h 1024 each, SwiGLU's three matrices 2 s h 14336 each,
    attention's scores 4 s^2 h (32 query heads, counted whole); the head 2 s h V. A step's
    3 x forward is then 6 x (parameters less the embedding and norms) x tokens plus 12 l
    s^2 h: the rule docs/flops.md states."""
    s, h, kv, ffn, v, layers = 8192, 4096, 1024, 14336, 128256, 32
    w = Workload(
        model="llama",
        dataset="tokens",
        seq_len=s,
        vocab=v,
        width=h,
        layers=layers,
        heads=32,
        kv_heads=8,
        ffn=ffn,
    )
    counts = workload_flops(w)
    layer = 2 * s * (2 * h * h + 2 * h * kv) + 2 * s * 3 * h * ffn + 4 * s * s * h
    assert counts == (0, *[layer] * layers, 2 * s * h * v)
    params = sum(p.numel() for p in w.build("meta").parameters())
    assert params == pytest.approx(8.03e9, rel=1e-3)
    matrices = params - v * h - (2 * layers + 1) * h  # no embedding lookup, no norms
    assert 3 * sum(counts) == 6 * matrices * s + 12 * layers * s * s * h


def test_counts_are_per_sample_and_linear_in_the_batch() -> None:
    w = Workload(model="gpt", dataset="tokens", seq_len=16, vocab=20, width=8, layers=1, heads=2)
    one = forward_flops(list(w.build("meta")), w.spec)
    four = forward_flops(list(w.build("meta")), w.spec, batch=4)
    assert one is not None and four == tuple(4 * n for n in one)


def test_a_model_on_real_weights_is_counted_without_running_it() -> None:
    """The parameters are swapped for shapes-only copies: the model's weights and their
    gradients are untouched, and a block that only runs on its own device still counts."""
    model = nn.Sequential(nn.Linear(6, 4))
    before = model[0].weight.detach().clone()
    assert forward_flops(list(model), _vectors(6)) == (2 * 6 * 4,)
    assert torch.equal(model[0].weight, before) and model[0].weight.grad is None


def test_a_block_that_cannot_run_on_meta_leaves_the_model_uncounted() -> None:
    class Reads(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * float(x.sum())  # reads a value: no meta kernel gives one

    assert forward_flops([nn.Linear(4, 4), Reads()], _vectors(4)) is None


def _uncounted(model: str) -> Profile:
    """A shipped profile as it was before the profiler counted FLOPs."""
    p = next(p for p in shipped("h100") if p.model == model)
    return replace(p, blocks=tuple(replace(b, forward_flops=None) for b in p.blocks))


def test_a_profile_without_counts_is_counted_from_its_workload() -> None:
    """counted() fills in a profile taken before the count from the workload it names.
    ResNet-50 at 224 x 224 is 4.09 G multiply-adds (torchvision's weights table,
    ResNet50_Weights: 4.09 'GFLOPS', which are multiply-adds)."""
    plain = _uncounted("resnet50")
    assert plain.forward_flops is None
    with_counts = counted(plain)
    assert with_counts.forward_flops == pytest.approx(2 * 4.09e9, rel=0.005)
    assert counted(with_counts) is with_counts  # its own counts are kept
    unnamed = replace(plain, workload={})  # a module profiled as given: nothing to count from
    assert counted(unnamed) is unnamed


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_every_shipped_profile_carries_the_count_of_its_workload(gpu: str) -> None:
    """The shipped profiles carry their counts (so that planning from them imports no
    counter), each what counting its workload gives now."""
    for p in shipped(gpu):
        assert [b.forward_flops for b in p.blocks] == list(
            workload_flops(Workload.from_dict(p.workload)) or []
        ), p.model


def test_counts_survive_the_profiles_json_and_older_files_load_without_them() -> None:
    plain = _uncounted("resnet18")
    with_counts = counted(plain)
    again = Profile.from_json(with_counts.to_json())
    assert [b.forward_flops for b in again.blocks] == [b.forward_flops for b in with_counts.blocks]
    assert again.forward_flops == with_counts.forward_flops
    assert Profile.from_json(plain.to_json()).forward_flops is None


def test_a_count_that_does_not_match_the_blocks_is_not_applied() -> None:
    plain = _uncounted("resnet18")
    assert with_forward_flops(plain, (1, 2)) is plain
    assert with_forward_flops(plain, None) is plain
    partial = replace(plain, blocks=(replace(plain.blocks[0], forward_flops=5), *plain.blocks[1:]))
    assert partial.forward_flops is None  # one block counted is not the model counted
