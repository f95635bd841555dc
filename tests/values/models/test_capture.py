"""Captured models (pipecast.values.models.capture) against the modules they were cut from.

The blocks share the module's Parameter objects, so the reference is the module itself:
the same forward output, and the same gradient in every parameter."""

from __future__ import annotations

import pytest
import torch
from tests import user_models
from torch import nn

from pipecast.errors import ConfigError, ShapeError
from pipecast.values.data.registry import get_spec
from pipecast.values.models import Workload
from pipecast.values.models.capture import capture, example_input
from pipecast.values.models.graph_blocks import GraphBlock, pack, unpack

IMAGES = get_spec("mnist")
TOKENS = get_spec("tokens", seq_len=16, vocab=64, width=32)
CASES = [
    (user_models.residual_net, IMAGES),
    (user_models.short_residual_net, IMAGES),
    (user_models.small_decoder, TOKENS),
    (user_models.small_llama, TOKENS),  # its Linears called as nn.Linear modules again
]


def _inputs(spec: object, batch: int) -> torch.Tensor:
    torch.manual_seed(1)
    x = example_input(spec, batch)  # type: ignore[arg-type]
    return torch.randint(0, 64, x.shape) if x.dtype == torch.long else torch.randn(x.shape)


def _grads(module: nn.Module, run: nn.Module, x: torch.Tensor) -> dict[int, torch.Tensor]:
    module.zero_grad(set_to_none=True)
    run(x).float().square().mean().backward()
    return {id(p): p.grad.clone() for p in module.parameters() if p.grad is not None}


@pytest.mark.parametrize(("factory", "spec"), CASES, ids=lambda c: getattr(c, "__name__", ""))
@pytest.mark.parametrize("batch", [1, 3])
def test_blocks_compute_the_module(factory: object, spec: object, batch: int) -> None:
    torch.manual_seed(0)
    module = factory(spec)  # type: ignore[operator]
    blocks = capture(module, spec, name="test")  # type: ignore[arg-type]
    assert len(blocks) >= 4
    assert all(isinstance(b, GraphBlock) for b in blocks)
    x = _inputs(spec, batch)  # batch sizes other than the exported example's
    torch.testing.assert_close(blocks(x), module(x), rtol=1e-6, atol=1e-6)
    want, got = _grads(module, module, x), _grads(module, blocks, x)
    assert set(got) == set(want)
    for key, grad in want.items():
        torch.testing.assert_close(got[key], grad, rtol=1e-5, atol=1e-7)


def test_cuts_prefer_one_tensor_and_fall_back_to_several() -> None:
    torch.manual_seed(0)
    long_net = capture(user_models.residual_net(IMAGES), IMAGES, name="net")
    assert all(len(b.takes) == 1 for b in long_net)  # between residual blocks only
    assert [b.label for b in long_net] == ["stem", *(f"stages.{i}" for i in range(4)), "head"]
    short = capture(user_models.short_residual_net(IMAGES), IMAGES, name="short")
    assert any(len(b.takes) == 2 for b in short)  # inside a residual block: x and the branch


def test_pack_round_trips_several_tensors() -> None:
    a, b = torch.randn(3, 2, 4), torch.randn(3, 5).to(torch.bfloat16)
    packed = pack([a, b])
    assert packed.shape == (3, 13) and packed.dtype == torch.float32
    out = unpack(packed, [((2, 4), "float32"), ((5,), "bfloat16")])
    assert torch.equal(out[0], a) and torch.equal(out[1], b.float())


def test_a_decoder_keeps_its_embedding_and_head_tied() -> None:
    torch.manual_seed(0)
    blocks = capture(user_models.small_decoder(TOKENS), TOKENS, name="decoder")
    holders = [i for i, b in enumerate(blocks) if b.tied]
    assert holders == [0, len(blocks) - 1]
    (first,) = blocks[0].tied
    (last,) = blocks[-1].tied
    assert blocks[0].get_parameter(first) is blocks[-1].get_parameter(last)


class _DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # a branch on a value: torch.export cannot trace it
            return self.fc(x.flatten(1))
        return -self.fc(x.flatten(1))


def test_a_module_export_cannot_take_fails_in_one_line() -> None:
    with pytest.raises(ShapeError) as caught:
        capture(_DataDependent(), IMAGES, name="mine:net")
    message = str(caught.value)
    assert "\n" not in message
    assert "mine:net (_DataDependent)" in message and "factory" in message


def test_hf_models_are_built_from_their_config() -> None:
    blocks = Workload(
        model="hf:gpt2", dataset="tokens", seq_len=16, vocab=64, width=32, layers=3
    ).build()
    labels = [b.label for b in blocks]
    assert sum(label.startswith("model.transformer.h.") for label in labels) >= 3
    with pytest.raises(ConfigError, match="unknown Hugging Face model type"):
        Workload(model="hf:no-such-model", dataset="tokens").build()


def test_hf_heads_follow_the_width_and_heads_given() -> None:
    """Llama's config fixes head_dim (128): width 32 over 4 heads must give heads of 8, a
    query projection 32 wide, not 4 x 128."""
    llama = Workload(
        model="hf:llama", dataset="tokens", seq_len=16, vocab=64, width=32, layers=1, heads=4
    ).build("meta")
    shapes = [tuple(p.shape) for n, p in llama.named_parameters() if n.endswith("q_proj.weight")]
    assert shapes == [(32, 32)]


def test_a_library_that_cannot_load_names_the_extra() -> None:
    try:
        import torchvision  # noqa: F401
    except Exception:
        with pytest.raises(ConfigError, match=r"pipecast\[models\]"):
            Workload(model="torchvision:resnet50", dataset="imagenet").build()
    else:
        pytest.skip("torchvision imports here; the error path needs a machine where it fails")


def test_blocks_captured_on_the_host_run_where_they_are_moved() -> None:
    """The decoder's graph makes position ids with arange(device=cpu); moved to another
    device (meta here, a GPU in use), its blocks must make them there."""
    torch.manual_seed(0)
    blocks = capture(user_models.small_decoder(TOKENS), TOKENS, name="decoder").to("meta")
    out = blocks(torch.zeros(3, *TOKENS.sample_shape, dtype=torch.long, device="meta"))
    assert out.device.type == "meta" and out.shape == (3, *TOKENS.sample_shape, 64)


def test_a_captured_llama_in_bf16_computes_what_hugging_faces_does() -> None:
    """Llama's RMSNorm and rotary embedding cast up to fp32 and back to the activations'
    dtype: captured in fp32 both casts did nothing and name fp32, and the capture reused the
    first for the residual. Cast to bf16, the blocks must cast up and back as the model
    does, and leave the residual in bf16: the same logits as the Hugging Face module in
    bf16, to the bit."""
    import copy

    torch.manual_seed(0)
    model = user_models.small_llama(TOKENS)
    reference = copy.deepcopy(model).to(torch.bfloat16)
    blocks = capture(model, TOKENS, name="llama").to(torch.bfloat16)
    x = _inputs(TOKENS, 2)
    got, want = blocks(x), reference(x)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, want)


def test_blocks_captured_in_fp32_run_in_bf16() -> None:
    """The decoder's graph casts position embeddings to fp32 (a no-op at capture) and asserts
    fp32: converted to bf16 as a bf16 run converts them, the blocks must compute in bf16."""
    torch.manual_seed(0)
    blocks = capture(user_models.small_decoder(TOKENS), TOKENS, name="decoder")
    out = blocks.to(torch.bfloat16)(torch.zeros(2, *TOKENS.sample_shape, dtype=torch.long))
    assert out.dtype == torch.bfloat16
