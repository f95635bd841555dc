"""W through the autograd engine against W by the op itself (runtime/weight_grads.py), on a
CPU: six small transformer layers (width 32, micro-batch 2 x 8 tokens, 42 nodes that feed
weights), one intra-op thread, host ms per W, three rounds of medians over 100.

    cd benchmarks && python3 weight_grads_cpu.py

On a GPU the same comparison is split_backward.py's 'nested' and 'runtime' roads.
"""

from __future__ import annotations

import statistics
import time

import common  # noqa: F401  (puts src/ on the path)
import torch
from torch import nn

from pipecast.runtime.backward import backward_input, backward_weight


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers = nn.Sequential(
        *[
            nn.TransformerEncoderLayer(
                32, 4, 64, dropout=0.0, batch_first=True, norm_first=True, activation="gelu"
            )
            for _ in range(6)
        ]
    )
    params = list(layers.parameters())
    x = torch.randn(2, 8, 32)

    def one(direct: bool) -> float:
        leaf = x.detach().requires_grad_(True)
        out = layers(leaf)
        _, work = backward_input(out, torch.ones_like(out), leaf, params)
        began = time.perf_counter()
        backward_weight(work, direct=direct)
        return time.perf_counter() - began

    print(f"torch {torch.__version__}")
    for round_ in range(3):
        for direct in (False, True):
            for _ in range(5):
                one(direct)
            ms = statistics.median(one(direct) for _ in range(100)) * 1e3
            print(f"round {round_} {'by the op' if direct else 'engine':9s} {ms:.2f} ms per W")


if __name__ == "__main__":
    main()
