"""What a block saves for its backward, where it saves tensor subclasses that wrap others
(torchao's Float8 tensors do): their inner tensors' storages, counted once each."""

from __future__ import annotations

import torch
from torch import nn
from torch.testing._internal.two_tensor import TwoTensor

from pipecast.measuring.profiler.measure import BlockRun, saved_storages, storages
from pipecast.measuring.profiler.options import ProfileOptions


class _Wrapping(nn.Module):
    """Saves two TwoTensors for its backward: tanh's output and the matmul's input."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(TwoTensor(x, x * 2) @ self.w)
        return y.a + y.b  # type: ignore[attr-defined, no-any-return]


def test_a_wrapper_tensor_holds_its_inner_tensors_storages() -> None:
    a, b = torch.zeros(3, 5), torch.zeros(3, 5)
    ptr = [t.untyped_storage().data_ptr() for t in (a, b)]
    assert storages(TwoTensor(a, b)) == [(ptr[0], 60), (ptr[1], 60)]
    assert storages(a) == [(ptr[0], 60)]


def test_a_block_saving_wrapped_tensors_counts_their_storages() -> None:
    block = _Wrapping()
    x = torch.randn(4, 8)
    options = ProfileOptions(micro_batch_sizes=(4,), device="cpu")
    run = BlockRun(block, x, 1, torch.device("cpu"), options)
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    saved, _ = saved_storages(run, params)
    # the input x (the run's leaf), x * 2, and tanh's output's two halves: 4 x 8 fp32 each
    assert sorted(saved.values()) == [128] * 4
