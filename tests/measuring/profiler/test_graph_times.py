"""The profiler's CUDA graph times: each block replayed through the runtime's graphs (on CPU
their stand-in), the whole model shared out, and the simulator's graphed stages priced by
them."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.planning.partition.test_partition import make_profile
from torch import nn

from pipecast.measuring.profiler.graphed import graph_times
from pipecast.measuring.profiler.profiler import ProfileOptions, profile_model
from pipecast.planning.simulation.pricing import costs_from_profile
from pipecast.runtime import graphs
from pipecast.values.hardware.presets import describe
from pipecast.values.models import Workload
from pipecast.values.partition import Partition, Stage
from pipecast.values.profile import Profile

FAST = ProfileOptions(micro_batch_sizes=(2, 4), warmup=1, repeats=3)


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(graphs.STAND_IN_ENV, "1")


def test_graph_times_leave_buffers_and_gradients_as_they_were() -> None:
    torch.manual_seed(0)
    block = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
    block.train()
    stats = [b.clone() for b in block.buffers()]
    weight = block[0].weight
    weight.grad = torch.full_like(weight, 3.0)
    x = torch.randn(4, 3, 10, 10)
    g = graph_times(block, x, True, torch.device("cpu"), FAST)
    assert g.forward > 0 and g.backward > 0 and g.pool_bytes == 0  # no pools on CPU
    # the replays ran BatchNorm in training mode and added gradients: both put back
    assert all(torch.equal(a, b) for a, b in zip(stats, block.buffers(), strict=True))
    assert torch.equal(weight.grad, torch.full_like(weight, 3.0))
    assert block[1].weight.grad is None


class _Slow(nn.Module):
    """A Linear whose forward takes at least `delay` seconds (sleeps are never shorter), and
    counts its calls."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.linear, self.delay, self.calls = nn.Linear(8, 8), delay, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        time.sleep(self.delay)
        out: torch.Tensor = self.linear(x)
        return out


def test_graph_times_take_the_median_of_the_kept_passes() -> None:
    slow = _Slow(0.02)
    options = ProfileOptions(micro_batch_sizes=(2,), warmup=2, repeats=3)
    g = graph_times(slow, torch.randn(4, 8), True, torch.device("cpu"), options)
    # one pass to size the output's gradient, then warm-up and kept passes (on CPU no hold
    # is needed, so one batch of them)
    assert slow.calls == 1 + 2 + 3  # and the backward never runs the forward again
    assert g.forward >= 0.02  # the sleep, read as the forward's time (a lower bound only:
    # a busy machine can stretch any reading)
    assert 0 < g.backward < math.inf


def test_profile_has_graph_times_only_where_graphs_run(stand_in: None) -> None:
    w = Workload(model="lenet5", dataset="mnist")
    p = profile_model(w.build(), w.spec, FAST, model_name="lenet5")
    assert p.graph_times
    for block in p.blocks:
        for mb in (2, 4):
            assert block.costs[mb].graph_forward > 0 and block.costs[mb].graph_backward > 0
    q = Profile.from_json(p.to_json())
    assert q.graph_times and q.blocks == p.blocks
    # the loss's device times, timed with its issuing hidden, join the last stage's
    assert q.loss_alone.keys() == {2, 4} and all(v > 0 for v in q.loss_alone[4])
    whole = q.stage(0, q.num_blocks, 4)
    assert whole.graph_forward == pytest.approx(
        sum(q.cost(i, 4).graph_forward for i in range(q.num_blocks)) + q.loss_alone[4][0]
    )
    assert q.stage(0, q.num_blocks - 1, 4).graph_forward == pytest.approx(
        sum(q.cost(i, 4).graph_forward for i in range(q.num_blocks - 1))
    )
    off = profile_model(w.build(), w.spec, replace(FAST, graph_times=False), model_name="l")
    assert not off.graph_times and off.blocks[3].costs[4].graph_forward == 0.0
    assert off.stage(0, off.num_blocks, 4).graph_forward == 0.0
    assert not off.loss_alone


def test_profile_without_graphs_on_cpu_has_no_graph_times() -> None:
    w = Workload(model="lenet5", dataset="mnist")
    p = profile_model(w.build(), w.spec, FAST, model_name="lenet5")
    assert not p.graph_times
    assert all(c.graph_forward == 0.0 for b in p.blocks for c in b.costs.values())


def _graphed_profile(fwd: list[float], graph_scale: float, **sizes: list[int]) -> Profile:
    base = make_profile(fwd, **sizes)
    blocks = tuple(
        replace(
            b,
            costs={
                mb: replace(
                    c,
                    graph_forward=graph_scale * c.forward,
                    graph_backward=graph_scale * c.backward,
                )
                for mb, c in b.costs.items()
            },
        )
        for b in base.blocks
    )
    return replace(base, blocks=blocks, graph_times=True)


def test_graphed_stages_are_priced_by_graph_times() -> None:
    """Graphed costs take the graph replays' device times; eager ones, and graphed ones from
    a profile without graph times, the eager device times."""
    profile = _graphed_profile([1.0, 2.0, 3.0, 4.0], graph_scale=0.5)
    cluster = describe(gpus_per_node=2, memory="80GiB")
    partition = Partition(stages=(Stage(0, 2, (0,)), Stage(2, 4, (1,))), num_blocks=4)
    eager = costs_from_profile(profile, partition, 8, cluster)
    graphed = costs_from_profile(profile, partition, 8, cluster, cuda_graphs=True)
    assert [s.forward for s in eager.stages] == pytest.approx([3.0, 7.0])
    assert [s.forward for s in graphed.stages] == pytest.approx([1.5, 3.5])
    assert [s.backward for s in graphed.stages] == pytest.approx([3.0, 7.0])
    # B and W keep the eager split's proportions (the first stage does it all in B)
    last = graphed.stages[1]
    assert last.backward_input + last.backward_weight == pytest.approx(last.backward)
    assert last.backward_input == pytest.approx(3.5)
    assert graphed.stages[0].backward_input == pytest.approx(3.0)
    without = replace(profile, graph_times=False)
    fallback = costs_from_profile(without, partition, 8, cluster, cuda_graphs=True)
    assert [s.forward for s in fallback.stages] == pytest.approx([3.0, 7.0])


def test_a_block_that_cannot_be_captured_leaves_the_profile_without_graph_times(
    stand_in: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipecast.measuring.profiler import graphed

    def refuse(*args: object, **kwargs: object) -> tuple[float, float]:
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    monkeypatch.setattr(graphed, "graph_times", refuse)
    w = Workload(model="lenet5", dataset="mnist")
    p = profile_model(w.build(), w.spec, FAST, model_name="lenet5")
    assert not p.graph_times
    assert p.graph_failure == (
        "block 0 (Conv2d): RuntimeError: operation not permitted when stream is capturing"
    )
    assert Profile.from_json(p.to_json()).graph_failure == p.graph_failure
    assert all(c.graph_forward == 0.0 for b in p.blocks for c in b.costs.values())


def test_profile_keeps_each_blocks_own_captured_pool(
    stand_in: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each block captured alone reports the pool its slot reserved; the profile keeps it
    per block and size (a GPU's reading; the CPU stand-in reserves nothing), through JSON
    and in proportion between sizes."""
    from pipecast.measuring.profiler import graphed

    real = graphed.graph_times

    def with_pool(module: nn.Module, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        times = real(module, x, *args, **kwargs)
        return graphed.GraphTimes(times.forward, times.backward, 1000 * x.shape[0] + 7)

    monkeypatch.setattr(graphed, "graph_times", with_pool)
    w = Workload(model="lenet5", dataset="mnist")
    p = Profile.from_json(profile_model(w.build(), w.spec, FAST, model_name="l").to_json())
    assert p.graph_times
    for b in p.blocks:
        assert {mb: c.graph_pool for mb, c in b.costs.items()} == {2: 2007, 4: 4007}
    assert p.cost(0, 8).graph_pool == 2 * 4007  # beyond the largest size, in proportion


def test_profile_cli_shows_graph_times_where_it_took_them(
    stand_in: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipecast.cli.main import main

    out = tmp_path / "lenet.json"
    argv = ["profile", "--model", "lenet5", "--micro-batch-sizes", "2", "--repeats", "2"]
    assert main([*argv, "-o", str(out)]) == 0
    assert "graph F" in capsys.readouterr().out and Profile.load(str(out)).graph_times
    assert main([*argv, "--no-graph-times", "-o", str(out)]) == 0
    assert "graph F" not in capsys.readouterr().out and not Profile.load(str(out)).graph_times
