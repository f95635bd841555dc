from __future__ import annotations

import pytest
import torch

from pipecast.errors import ShapeError
from pipecast.values.data import get_spec
from pipecast.values.models import Workload, build_zoo_model, model_names, summarize

IMAGE_MODELS = ["lenet5", "vgg11", "vgg16", "resnet18", "resnet50", "resnet152", "mobilenetv2"]
IMAGE_SETS = ["mnist", "digits", "cifar10", "imagenet", "highres"]


def _check_chain(workload: Workload, batch: int = 2, device: str = "cpu") -> torch.Tensor:
    """Runs the blocks one after another, each on the last one's output; `device="meta"`
    checks every shape without computing anything."""
    model = workload.build(device).eval()
    spec = workload.spec
    if spec.input_kind == "tokens":
        x = torch.randint(0, spec.num_classes, (batch, *spec.sample_shape), device=device)
    else:
        x = torch.randn(batch, *spec.sample_shape, device=device)
    with torch.no_grad():
        for index, block in enumerate(model):
            y = block(x)
            assert isinstance(y, torch.Tensor), f"block {index} returned {type(y)}"
            assert y.shape[0] == batch
            x = y
    return x


@pytest.mark.parametrize("dataset", IMAGE_SETS)
@pytest.mark.parametrize("model", IMAGE_MODELS)
def test_image_models_chain_and_classify(model: str, dataset: str) -> None:
    if dataset == "highres" and model in ("vgg16", "resnet152", "vgg11"):
        pytest.skip("covered by the slow highres test")
    out = _check_chain(Workload(model=model, dataset=dataset))
    assert out.shape == (2, get_spec(dataset).num_classes)
    assert torch.isfinite(out).all()


@pytest.mark.slow
@pytest.mark.parametrize("model", ["vgg11", "vgg16", "resnet152"])
def test_large_models_at_highres(model: str) -> None:
    """Shapes only (on the meta device): the other data sets run these models' blocks on
    real numbers, and 512x512 adds only larger activations to the arithmetic."""
    out = _check_chain(Workload(model=model, dataset="highres"), device="meta")
    assert out.shape == (2, 1000)


def test_gpt_predicts_next_token_logits() -> None:
    w = Workload(model="gpt", dataset="tokens", seq_len=16, vocab=50, width=32, layers=2, heads=4)
    out = _check_chain(w)
    assert out.shape == (2, 16, 50)
    assert len(w.build()) == 1 + 2 + 1


def test_gpt_is_causal() -> None:
    w = Workload(model="gpt", dataset="tokens", seq_len=8, vocab=20, width=16, layers=1, heads=2)
    model = w.build().eval()
    ids = torch.randint(0, 20, (1, 8))
    changed = ids.clone()
    changed[0, 5] = (ids[0, 5] + 1) % 20
    with torch.no_grad():
        a, b = model(ids), model(changed)
    assert torch.allclose(a[0, :5], b[0, :5])  # earlier positions never see later tokens
    assert not torch.allclose(a[0, 5:], b[0, 5:])


def test_transformer_stack_keeps_embedding_shape() -> None:
    w = Workload(model="transformer", dataset="embeddings", seq_len=8, width=32, layers=3, heads=4)
    out = _check_chain(w)
    assert out.shape == (2, 8, 32)


def test_published_parameter_counts() -> None:
    def params(name: str) -> int:
        return sum(p.numel() for p in build_zoo_model(name, get_spec("imagenet")).parameters())

    assert round(params("vgg16") / 1e6, 1) == 138.4
    assert round(params("resnet50") / 1e6, 1) == 25.6
    assert len(build_zoo_model("vgg16", get_spec("imagenet"))) == 40


def test_summary_counts_flops_and_shapes() -> None:
    w = Workload(model="vgg16", dataset="imagenet")
    rows = summarize(w.build("meta"), w.spec)
    assert rows[0].output_shape == (64, 224, 224)
    assert rows[-1].output_shape == (1000,)
    # VGG-16 forward is 15.5 GMACs per 224x224 image
    assert 30.5e9 < sum(r.flops for r in rows) < 31.5e9
    assert sum(r.params for r in rows) == 138_357_544


def test_incompatible_dataset_names_the_fix() -> None:
    with pytest.raises(ShapeError, match="use 'tokens'"):
        Workload(model="gpt", dataset="cifar10").build()
    with pytest.raises(ShapeError, match="image data set"):
        Workload(model="resnet18", dataset="tokens").build()


def test_every_zoo_model_listed() -> None:
    assert set(IMAGE_MODELS) | {"gpt", "llama", "transformer"} == set(model_names())
