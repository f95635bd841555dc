"""Saved activations through the host (pipecast.runtime.offload): the backward sees what the
forward saved, every non-parameter saved tensor goes through the hooks, parameters do not."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipecast.runtime.offload import HostActivations


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def test_gradients_through_the_host_equal_plain_ones() -> None:
    x = torch.randn(5, 8)
    plain, moved = _model(), _model()
    plain(x).square().sum().backward()
    hooks = HostActivations(torch.device("cpu"))
    with hooks.saving():
        out = moved(x)
    out.square().sum().backward()
    for a, b in zip(plain.parameters(), moved.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None
        assert torch.equal(a.grad, b.grad)
    # saved: x for the first weight's gradient, tanh's output and the second linear's input
    # (the same tensor, saved twice); not the second weight's transpose, a view of a weight
    assert hooks.moved_bytes == 5 * 4 * (8 + 16 + 16)


def test_parameters_are_not_moved() -> None:
    hooks = HostActivations(torch.device("cpu"))
    w = nn.Parameter(torch.randn(3))
    assert hooks.pack(w) is w
    t = torch.randn(3)
    packed = hooks.pack(t)
    assert packed is not t and torch.equal(hooks.unpack(packed), t)


def test_an_optimizer_on_the_host_steps_its_own_copy_and_copies_back() -> None:
    """Adam on the host: its state belongs to the host's copies, not to the module's
    weights; a step there moves the module's weights as torch's fused Adam on them would;
    the checkpoint still names the state by the module's parameters."""
    from pipecast.runtime.checkpoint import stage_state
    from pipecast.runtime.config import RunConfig
    from pipecast.runtime.stage import StageModule

    def stage(offload: str) -> StageModule:
        config = RunConfig(optimizer="adam", lr=0.01, offload=offload)  # type: ignore[arg-type]
        return StageModule(0, _model(), torch.device("cpu"), config, first=True, last=True)

    x = torch.randn(5, 8)
    plain, hosted = stage("none"), stage("optimizer")
    # the host's Adam is torch's fused one (one vectorised pass a tensor): bit for bit
    plain.optimizer = torch.optim.Adam(plain.params, lr=0.01, fused=True)
    assert hosted.optimizer is not None and hosted.host_params is not None
    stepped = [q for g in hosted.optimizer.param_groups for q in g["params"]]
    assert not any(q is p for q, p in zip(stepped, hosted.params, strict=True))
    for st in (plain, hosted):
        for _ in range(2):
            st.module(x).square().sum().backward()
            st.step()
            st.zero_grad(set_to_none=True)
    for a, b in zip(plain.params, hosted.params, strict=True):
        assert torch.equal(a, b) and b.grad is None
    assert set(stage_state(hosted.module, hosted.optimizer, 0)["optimizer"]) == {
        n for n, _ in hosted.module.named_parameters()
    }


def test_streamed_weights_leave_two_blocks_on_the_device_and_the_same_gradients() -> None:
    """Four blocks streamed from host copies: each block's forward finds its weights in
    place and at most two blocks' storage exists at once, in the forward and in the
    backward (which brings back what the forward released); the gradients are the plain
    ones. Each block's weights came in twice (forward and backward) but the last block's,
    still in place when the backward begins."""
    from pipecast.runtime.weight_stream import WeightStream, hooks_of

    def blocks() -> nn.Sequential:
        torch.manual_seed(0)
        return nn.Sequential(*(nn.Sequential(nn.Linear(6, 6), nn.Tanh()) for _ in range(4)))

    x = torch.randn(3, 6)
    plain, streamed = blocks(), blocks()
    plain(x).square().sum().backward()
    params = list(streamed.parameters())
    host = [p.detach().clone() for p in params]
    stream = WeightStream(list(streamed), params, host, torch.device("cpu"))
    resident: list[int] = []

    def count(*_: object) -> None:
        resident.append(sum(1 for b in stream.blocks if b.resident))

    for block in streamed:
        block.register_forward_hook(count)
    pack, unpack = hooks_of(stream, None)

    def counted(saved: object) -> torch.Tensor:
        out = unpack(saved)
        count()
        return out

    assert not any(p.untyped_storage().size() for p in params)
    with torch.autograd.graph.saved_tensors_hooks(pack, counted):
        out = streamed(x)
    out.square().sum().backward()
    assert len(resident) > 4 and max(resident) == 2
    for a, b in zip(plain.parameters(), streamed.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None
        assert torch.equal(a.grad, b.grad)
    assert stream.moved_bytes == 7 * (6 * 6 + 6) * 4


class _Copy:
    """A stand-in for a CUDA event marking a copy done: `done` says whether query() finds
    it finished; synchronize() waits for it (and records that it was waited for)."""

    def __init__(self, name: str, done: bool, waited: list[str]) -> None:
        self.name, self.done, self.waited = name, done, waited

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        if not self.done:
            self.waited.append(self.name)
        self.done = True


def test_copies_under_way_stay_within_the_bound() -> None:
    """Bound 100: two copies of 60 under way are 120, so the forward waits for the older;
    one done is dropped without a wait; a copy of 200 alone is over the bound, so every
    older one is waited for, and it stays the only one under way."""
    hooks = HostActivations(torch.device("cpu"), in_flight=100)
    waited: list[str] = []
    a, b = _Copy("a", False, waited), _Copy("b", False, waited)
    hooks._under_way(a, 60)
    assert hooks.copying == 60 and waited == []
    hooks._under_way(b, 60)
    assert waited == ["a"] and hooks.copying == 60
    b.done = True
    hooks._under_way(_Copy("c", False, waited), 30)
    assert waited == ["a"] and hooks.copying == 30  # b was done: dropped, not waited for
    hooks._under_way(_Copy("d", False, waited), 200)
    assert waited == ["a", "c"] and hooks.copying == 200 and len(hooks.copies) == 1
    assert hooks.most_copying == 200


def test_copies_exactly_at_the_bound_go_on_and_the_most_under_way_is_kept() -> None:
    """Bound 100: 40 then 60 under way are 100, not past it, so nothing is waited for; once
    both are done a copy of 10 drops them, and the most under way at once stays 100."""
    hooks = HostActivations(torch.device("cpu"), in_flight=100)
    waited: list[str] = []
    a, b = _Copy("a", False, waited), _Copy("b", False, waited)
    hooks._under_way(a, 40)
    hooks._under_way(b, 60)
    assert waited == [] and hooks.copying == 100 and len(hooks.copies) == 2
    a.done = b.done = True
    hooks._under_way(_Copy("c", False, waited), 10)
    assert waited == [] and hooks.copying == 10 and len(hooks.copies) == 1
    assert hooks.most_copying == 100


@pytest.mark.parametrize("optimizer", ["adam", "momentum", "sgd"])
def test_only_the_host_optimizer_is_torchs_fused_one(optimizer: str) -> None:
    """Every optimizer kind on the host (offload 'optimizer') is built fused, as torch
    records it in the optimizer's defaults; on the device it is torch's default (unfused)."""
    from pipecast.runtime.config import RunConfig
    from pipecast.runtime.stage import StageModule

    def stage(offload: str) -> StageModule:
        config = RunConfig(optimizer=optimizer, lr=0.01, offload=offload)  # type: ignore[arg-type]
        return StageModule(0, _model(), torch.device("cpu"), config, first=True, last=True)

    plain, hosted = stage("none"), stage("optimizer")
    assert hosted.optimizer is not None and plain.optimizer is not None
    assert hosted.optimizer.defaults["fused"] is True
    assert not plain.optimizer.defaults["fused"]
