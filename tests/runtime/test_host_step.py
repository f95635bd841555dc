"""The host optimizer stepped block by block beside the backward (pipecast.runtime.host_step):
a block's step starts as soon as the last backward has delivered its gradients, the device
keeps none of them, and the weights after the steps are those of one optimizer over the whole
model stepped after the whole backward (torch's Adam, one process)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipecast.runtime.host_step import HostStep, host_threads

CPU = torch.device("cpu")


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4))


def _hosted(overlap: bool) -> tuple[nn.Sequential, HostStep]:
    module = _model()
    params = list(module.parameters())
    host = [nn.Parameter(p.detach().clone()) for p in params]
    step = HostStep(
        list(module), params, host, lambda ps: torch.optim.Adam(ps, lr=0.1), CPU, streamed=False
    )
    step.overlap = overlap
    return module, step


def _batches(micro: int) -> list[torch.Tensor]:
    torch.manual_seed(1)
    return [torch.randn(4, 8) for _ in range(micro)]


def _reference(steps: int, micro: int) -> nn.Sequential:
    module = _model()
    opt = torch.optim.Adam(module.parameters(), lr=0.1)
    for _ in range(steps):
        for x in _batches(micro):
            module(x).square().sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return module


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("micro", [1, 3])
def test_block_by_block_steps_give_one_optimizers_weights(overlap: bool, micro: int) -> None:
    module, host = _hosted(overlap)
    for _ in range(3):
        for i, x in enumerate(_batches(micro)):
            if i == micro - 1:
                host.last_backward()
            module(x).square().sum().backward()
        host.step()
        for p in module.parameters():
            p.grad = None
    want = _reference(3, micro)
    for a, b in zip(module.parameters(), want.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert len(host.optimizer.param_groups) == 3  # a group per block with weights


def test_a_block_steps_before_the_backward_reaches_the_block_below_it() -> None:
    """When the backward reaches block 0 (the gradient of its output), blocks 2 and 4 have
    been submitted to the host's step and hold no gradient on the device; block 0 has not."""
    module, host = _hosted(overlap=True)
    seen: dict[str, object] = {}

    def at_block_0(grad: torch.Tensor) -> None:
        seen["stepped"] = [g.stepped for g in host.groups]
        seen["on_device"] = [p.grad is not None for p in module.parameters()]

    host.last_backward()
    out = module[0](torch.randn(4, 8))
    out.register_hook(at_block_0)
    module[1:](out).square().sum().backward()
    assert seen["stepped"] == [False, True, True]
    assert seen["on_device"] == [False, False, False, False, False, False]
    assert all(p.grad is None for p in module.parameters())
    host.step()
    assert all(g.stepped is False for g in host.groups)  # ready for the next step


def test_without_overlap_the_device_keeps_its_gradients() -> None:
    """CUDA graphs accumulate into .grad's own memory: where the overlap is off the
    gradients stay, and the host's step takes copies at the step's end."""
    module, host = _hosted(overlap=False)
    host.last_backward()
    module(torch.randn(4, 8)).square().sum().backward()
    assert not any(g.stepped for g in host.groups)
    grads = [p.grad.clone() for p in module.parameters() if p.grad is not None]
    host.step()
    assert len(grads) == 6
    for p, g in zip(module.parameters(), grads, strict=True):
        assert p.grad is not None and torch.equal(p.grad, g)


@pytest.mark.parametrize(("intra", "given", "want"), [(16, "", 14), (2, "", 1), (16, "3", 3)])
def test_the_host_step_leaves_two_cores_to_the_threads_beside_it(
    monkeypatch: pytest.MonkeyPatch, intra: int, given: str, want: int
) -> None:
    """Unless told, the host's optimizer takes torch's intra-op threads less the issuing
    thread and autograd's, and at least one."""
    monkeypatch.setenv("PIPECAST_HOST_THREADS", given)
    monkeypatch.setattr(torch, "get_num_threads", lambda: intra)
    assert host_threads() == want


@pytest.mark.parametrize("overlap", [True, False])
def test_a_step_records_the_weights_the_host_stepped_and_its_time(overlap: bool) -> None:
    """Every parameter got a gradient: the step covers all their bytes (the model's fp32
    weights), in some positive time; a step where only the last block got one covers that
    block's alone."""
    module, host = _hosted(overlap)
    host.last_backward()
    module(torch.randn(4, 8)).square().sum().backward()
    host.step()
    seconds, nbytes = host.last_stepped
    assert nbytes == sum(p.numel() * 4 for p in module.parameters()) == 4 * (72 + 72 + 36)
    assert seconds > 0
    for p in module.parameters():
        p.grad = None
    host.last_backward()
    module[4](torch.randn(4, 8)).square().sum().backward()
    host.step()
    assert host.last_stepped[1] == 4 * 36
