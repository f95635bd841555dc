"""A deep model's profile tiled from a few measured layers (values/profile/tile.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.planning.partition.test_partition import make_profile

from pipecast.cli.main import main
from pipecast.errors import ConfigError
from pipecast.values.models import Workload
from pipecast.values.profile.tile import Repeat, layer_repeat, repeat_of, tiled
from pipecast.values.profile.types import Profile

GPT = Workload(model="gpt", dataset="tokens", width=32, heads=4, seq_len=16, vocab=64, layers=2)


def test_the_layers_are_found_between_what_comes_before_and_after() -> None:
    assert repeat_of(["Emb", "Block", "Head"], ["Emb", "Block", "Block", "Head"]) == Repeat(1, 1)
    assert repeat_of(["A", "M", "N"], ["A", "M", "A", "M", "N"]) == Repeat(0, 2)
    assert layer_repeat(GPT) == Repeat(prefix=1, period=1)
    stack = Workload(model="transformer", dataset="embeddings", width=32, heads=4, seq_len=8)
    assert layer_repeat(stack) == Repeat(prefix=0, period=1)
    with pytest.raises(ConfigError, match="not blocks of their own"):
        repeat_of(["A", "B"], ["A", "B"])


def test_the_last_measured_layer_stands_for_the_rest() -> None:
    """Blocks embedding, layer 1, layer 2, head (forward 1, 2, 3, 4 ms) tiled to 4 layers:
    1, 2, 3, 3, 3, 4, renumbered; the workload says 4 layers, the profile that it tiled."""
    base = make_profile([1e-3, 2e-3, 3e-3, 4e-3])
    base = replace(base, workload=GPT.to_dict())
    out = tiled(base, 2, 4, Repeat(prefix=1, period=1))
    size = base.micro_batch_sizes[0]
    assert [round(b.costs[size].forward * 1e3) for b in out.blocks] == [1, 2, 3, 3, 3, 4]
    assert [b.index for b in out.blocks] == list(range(6))
    assert out.workload["layers"] == 4 and out.tiled == "measured at 2 layers, tiled to 4"
    with pytest.raises(ConfigError, match="not down to 1"):
        tiled(base, 2, 1, Repeat(prefix=1, period=1))


def test_profile_measures_two_layers_and_writes_the_deep_models(tmp_path: object) -> None:
    """The tiled profile holds the deep model's blocks and parameters, counted against the
    deep model itself built on the meta device."""
    out = f"{tmp_path}/p.json"
    argv = ["profile", "--model", "gpt", "--dataset", "tokens", "--width", "32", "--heads", "4"]
    argv += ["--seq-len", "16", "--vocab", "64", "--layers", "6", "--measure-layers", "2"]
    argv += ["--micro-batch-sizes", "2", "--repeats", "1", "--warmup", "0", "-o", out]
    assert main(argv) == 0
    profile = Profile.load(out)
    deep = replace(GPT, layers=6).build("meta")
    assert profile.num_blocks == len(deep) == 8
    assert profile.params == sum(p.numel() for p in deep.parameters())
    assert "tiled to 6" in profile.tiled and profile.workload["layers"] == 6
