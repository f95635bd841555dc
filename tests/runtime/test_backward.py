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


class _Pieces(nn.Module):
    """Every node kind W computes without the engine, and some it leaves to it: Linear on 2-
    and 3-dimensional inputs, with and without a bias, a weight used twice, LayerNorm, a
    bias added on its own, an addmm with alpha 2, a convolution with a stride and groups,
    BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(8, 8, bias=False)
        self.norm = nn.LayerNorm(8)
        self.bias = nn.Parameter(torch.randn(8))
        self.scaled = nn.Parameter(torch.randn(8, 8))
        self.conv = nn.Conv1d(3, 6, 3, stride=2, padding=1, groups=3)
        self.bn = nn.BatchNorm1d(6)
        self.back = nn.Conv1d(6, 3, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (2, 3, 6)
        h = self.a(x)  # 3-d: addmm behind a view
        h = self.b(torch.tanh(h)) + self.b(h)  # one weight, two uses
        h = self.norm(h) + self.bias
        flat = torch.addmm(h.flatten(0, 1), h.flatten(0, 1), self.scaled, alpha=2.0)
        conv = self.back(self.bn(self.conv(flat.view(2, 3, 8))))  # (2, 3, 4)
        out: torch.Tensor = torch.cat([conv, conv], dim=-1) + self.a(flat.view(2, 3, 8)[..., :6])
        return out


def _split_grads(
    model: nn.Module, x: torch.Tensor, g: torch.Tensor, direct: bool
) -> list[torch.Tensor]:
    params = list(model.parameters())
    for p in params:
        p.grad = None
    leaf = x.detach().requires_grad_()
    _, work = backward_input(model(leaf), g, leaf, params)
    backward_weight(work, direct=direct)
    return [p.grad.clone() for p in params if p.grad is not None]


@pytest.mark.parametrize(("dtype", "rtol"), [(torch.float32, 1e-6), (torch.float64, 1e-13)])
def test_w_without_the_engine_gives_its_gradients(dtype: torch.dtype, rtol: float) -> None:
    """The node kinds weight_grads computes itself give the engine's gradients (the same ops
    on the same saved tensors; a weight used twice is added into inside its second product,
    which rounds once where the engine rounds twice); the kinds it leaves alone still come
    out right."""
    torch.manual_seed(0)
    model = _Pieces().to(dtype)
    x = torch.randn(2, 3, 6, dtype=dtype)
    g = torch.randn(2, 3, 8, dtype=dtype)
    through_engine = _split_grads(model, x, g, direct=False)
    direct = _split_grads(model, x, g, direct=True)
    assert len(direct) == len(list(model.parameters()))
    for a, b in zip(through_engine, direct, strict=True):
        assert torch.allclose(a, b, rtol=rtol, atol=rtol)
    expected = _reference(model, x, g)[1:]
    for got, want in zip(direct, expected, strict=True):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)


def test_w_without_the_engine_makes_no_autograd_call_for_linear_and_layernorm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A transformer layer's W: every node done directly; BatchNorm's through the
    engine; a parameter with a hook through the engine too, so the hook runs."""
    from pipecast.runtime import backward

    calls: list[int] = []
    real = backward.engine_call

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(backward, "engine_call", counted)
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=True)
    x, g = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    _split_grads(layer, x, g, direct=True)
    assert len(calls) == 1  # B's own call, and none in W
    calls.clear()
    conv = nn.Sequential(nn.Conv1d(3, 3, 1), nn.BatchNorm1d(3), nn.Conv1d(3, 3, 1))
    _split_grads(conv, torch.randn(2, 3, 4), torch.randn(2, 3, 4), direct=True)
    assert len(calls) == 1 + 1  # B's, and W's one for BatchNorm (convolutions by the op)
    calls.clear()
    seen: list[torch.Tensor] = []
    mlp = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    mlp[1].weight.register_hook(lambda grad: seen.append(grad))
    _split_grads(mlp, torch.randn(3, 4), torch.randn(3, 4), direct=True)
    assert len(calls) == 1 + 1 and len(seen) == 1


class _Twice(nn.Module):
    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.module(torch.tanh(self.module(x)))
        return out


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_a_module_called_twice_down_the_input_path_counts_each_use_once(
    direct: bool, kind: str
) -> None:
    """Re-entering the upper use's node would run on down the input path to the lower use
    and add it a second time: such parameters are differentiated once, from the output."""
    torch.manual_seed(0)
    inner = nn.Linear(5, 5) if kind == "linear" else nn.Conv1d(5, 5, 1)
    model = _Twice(inner).double()
    shape = (3, 5) if kind == "linear" else (2, 5, 4)
    x, g = torch.randn(*shape, dtype=torch.float64), torch.randn(*shape, dtype=torch.float64)
    got = _split_grads(model, x, g, direct=direct)
    for a, b in zip(got, _reference(model, x, g)[1:], strict=True):
        assert torch.allclose(a, b)


def test_w_under_autocast_leaves_cast_weights_to_the_engine() -> None:
    """Under autocast a Linear's weight reaches its node through a cast: W leaves such nodes
    to the engine, and the gradients are the engine's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 4))
    x, g = torch.randn(4, 8), torch.randn(4, 4, dtype=torch.bfloat16)
    results = []
    for direct in (False, True):
        for p in model.parameters():
            p.grad = None
        leaf = x.detach().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(leaf)
        _, work = backward_input(out, g, leaf, list(model.parameters()))
        backward_weight(work, direct=direct)
        results.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert len(results[1]) == len(list(model.parameters()))
    for a, b in zip(*results, strict=True):
        assert a.dtype == torch.float32 and torch.equal(a, b)


def test_w_adds_linear_gradients_inside_the_matrix_product(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a Linear's weight and bias already hold gradients (a graphed stage, a later
    micro-batch), W adds into them within the product, computing no separate gradient:
    the sum equals the held gradients plus the engine's own."""
    from pipecast.runtime import weight_grads

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 5))
    held = [torch.randn_like(p) for p in model.parameters()]
    x, g = torch.randn(7, 6, dtype=torch.float64), torch.randn(7, 5, dtype=torch.float64)
    model = model.double()
    held = [h.double() for h in held]
    engine = _split_grads(model, x, g, direct=False)

    def no_separate_gradient(*args: object) -> None:
        raise AssertionError("computed a separate gradient")

    monkeypatch.setattr(weight_grads, "direct", no_separate_gradient)
    params = list(model.parameters())
    for p, h in zip(params, held, strict=True):
        p.grad = h.clone()
    leaf = x.detach().requires_grad_()
    _, work = backward_input(model(leaf), g, leaf, params)
    backward_weight(work, direct=True)
    for p, h, e in zip(params, held, engine, strict=True):
        assert p.grad is not None
        assert torch.allclose(p.grad, h + e, rtol=1e-12, atol=1e-12)
