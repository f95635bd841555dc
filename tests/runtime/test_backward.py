"""The B/W split must give exactly the gradients of one whole backward, for any module."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipecast.runtime import autograd_calls
from pipecast.runtime.backward import (
    backward_full,
    backward_input,
    backward_weight,
    backward_weights,
)


@pytest.fixture(params=["direct", "public"])
def engine_road(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every split test runs twice: straight into autograd's engine (the default) and
    through torch.autograd's public functions (the road taken where the direct call fails)."""
    monkeypatch.setattr(autograd_calls, "_DIRECT_ENGINE", request.param == "direct")
    return str(request.param)


def _reference(model: nn.Module, x: torch.Tensor, g: torch.Tensor) -> list[torch.Tensor]:
    leaf = x.detach().requires_grad_()
    out = model(leaf)
    grads = torch.autograd.grad(out, [leaf, *model.parameters()], g)
    return list(grads)


STAGES = {
    "mlp": lambda: nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 5), nn.LayerNorm(5)),
    "conv-bn": lambda: nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 3)
    ),
    "encoder": lambda: nn.Sequential(
        nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=True),
        nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True),
    ),
}
INPUTS = {"mlp": (4, 6), "conv-bn": (2, 3, 8, 8), "encoder": (2, 5, 16)}


@pytest.mark.parametrize("name", list(STAGES))
def test_split_equals_whole_backward(name: str, engine_road: str) -> None:
    model = STAGES[name]().double()
    x = torch.randn(*INPUTS[name], dtype=torch.float64)
    out_shape = model(x).shape
    g = torch.randn(out_shape, dtype=torch.float64)
    expected = _reference(model, x, g)
    params = list(model.parameters())

    leaf = x.detach().requires_grad_()
    grad_input, work = backward_input(model(leaf), g, leaf, params)
    assert all(p.grad is None for p in params), "B must not touch weight gradients"
    assert grad_input is not None and torch.allclose(grad_input, expected[0])
    assert work.captured, "weight gradients should come from captured nodes, not a re-run"
    backward_weight(work)
    for p, e in zip(params, expected[1:], strict=True):
        assert p.grad is not None and torch.allclose(p.grad, e)

    for p in params:
        p.grad = None
    leaf = x.detach().requires_grad_()
    full_input = backward_full(model(leaf), g, leaf, params)
    assert full_input is not None and torch.allclose(full_input, expected[0])
    for p, e in zip(params, expected[1:], strict=True):
        assert p.grad is not None and torch.allclose(p.grad, e)


def test_split_accumulates_over_micro_batches(engine_road: str) -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    xs = [torch.randn(2, 3, dtype=torch.float64) for _ in range(3)]
    gs = [torch.randn(2, 2, dtype=torch.float64) for _ in range(3)]
    expected = [torch.zeros_like(p) for p in model.parameters()]
    for x, g in zip(xs, gs, strict=True):
        for acc, e in zip(expected, _reference(model, x, g)[1:], strict=True):
            acc += e
    works = []
    for x, g in zip(xs, gs, strict=True):  # all B first, then all W, as zero-bubble does
        leaf = x.detach().requires_grad_()
        works.append(backward_input(model(leaf), g, leaf, list(model.parameters()))[1])
    for work in works:
        backward_weight(work)
    for p, e in zip(model.parameters(), expected, strict=True):
        assert p.grad is not None and torch.allclose(p.grad, e)


def test_first_stage_does_everything_in_b(engine_road: str) -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    out = model(torch.randn(5, 3)).sum()
    grad_input, work = backward_input(out, None, None, list(model.parameters()))
    assert grad_input is None and not work.captured and not work.uncovered
    assert all(p.grad is not None for p in model.parameters())


def test_parameter_off_the_input_path_is_still_covered(engine_road: str) -> None:
    class AddBias(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = nn.Embedding(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.table(torch.arange(x.shape[0]) % 4)

    model = nn.Sequential(nn.Linear(3, 3), AddBias()).double()
    x, g = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    expected = _reference(model, x, g)
    leaf = x.detach().requires_grad_()
    _, work = backward_input(model(leaf), g, leaf, list(model.parameters()))
    backward_weight(work)
    for p, e in zip(model.parameters(), expected[1:], strict=True):
        assert p.grad is not None and torch.allclose(p.grad, e)


def test_this_torch_takes_the_direct_road() -> None:
    """The fast road is checked once at import; on the supported torch it must be open."""
    assert autograd_calls._direct_engine_works()
    assert autograd_calls._DIRECT_ENGINE
    with torch.no_grad():  # pipecast imported where autograd is off finds the same
        assert autograd_calls._direct_engine_works()
    with torch.inference_mode():
        assert autograd_calls._direct_engine_works()


def test_whole_backward_frees_the_graph(engine_road: str) -> None:
    """BW lets go of saved activations as it goes, as a plain .backward() does."""
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    leaf = torch.randn(2, 3).requires_grad_()
    out = model(leaf)
    backward_full(out, torch.ones(2, 2), leaf, list(model.parameters()))
    with pytest.raises(RuntimeError, match="second time"):
        backward_full(out, torch.ones(2, 2), leaf, list(model.parameters()))


@pytest.mark.parametrize("nest", [False, True])
def test_weights_of_an_action_from_inside_one_backward(nest: bool, engine_road: str) -> None:
    """W of several segments and micro-batches at once, plainly or from inside one outer
    backward (what a GPU does), gives the whole backward's weight gradients."""
    model = STAGES["encoder"]().double()
    params = list(model.parameters())
    xs = [torch.randn(*INPUTS["encoder"], dtype=torch.float64) for _ in range(2)]
    gs = [torch.randn(*INPUTS["encoder"], dtype=torch.float64) for _ in range(2)]
    expected = [torch.zeros_like(p) for p in params]
    for x, g in zip(xs, gs, strict=True):
        for acc, e in zip(expected, _reference(model, x, g)[1:], strict=True):
            acc += e
    works = []
    for x, g in zip(xs, gs, strict=True):
        leaf = x.detach().requires_grad_()
        works.append(backward_input(model(leaf), g, leaf, params)[1])
    backward_weights(works, torch.device("cpu"), nest=nest)
    assert all(not w.captured for w in works), "every work is spent"
    for p, e in zip(params, expected, strict=True):
        assert p.grad is not None and torch.allclose(p.grad, e)


def test_an_error_inside_the_engine_thread_comes_out_as_itself() -> None:
    def fails() -> None:
        raise ValueError("inside W")

    with pytest.raises(ValueError, match="inside W"):
        autograd_calls.on_engine_thread(fails, torch.device("cpu"))


def test_the_engine_thread_runs_for_a_caller_with_autograd_off() -> None:
    ran = []
    with torch.no_grad():
        autograd_calls.on_engine_thread(lambda: ran.append(True), torch.device("cpu"))
    assert ran == [True]


def test_a_gpu_w_with_nothing_to_do_makes_no_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first stage's W is empty: on a GPU it must not pay a trip to the engine's
    thread for nothing."""
    import pipecast.runtime.backward as backward_module

    def no_trip(fn: object, device: object) -> None:
        raise AssertionError("went to the engine's thread with nothing to do")

    monkeypatch.setattr(backward_module, "on_engine_thread", no_trip)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    _, work = backward_input(model(torch.randn(5, 3)).sum(), None, None, list(model.parameters()))
    assert not work.pending
    backward_weights([work, work], torch.device("cuda"))
    leaf = torch.randn(5, 3).requires_grad_()
    _, busy = backward_input(model(leaf).sum(), None, leaf, list(model.parameters()))
    assert busy.pending
    with pytest.raises(AssertionError, match="nothing to do"):
        backward_weights([busy], torch.device("cuda"))
