from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from pipecast.cli.main import main
from pipecast.errors import ConfigError, DataError, DeviceError, ShapeError
from pipecast.measuring import hostspeed
from pipecast.measuring.profiler.context import (
    Context,
    across_windows,
    in_place,
    in_situ,
    in_situ_hidden,
    rescale,
)
from pipecast.measuring.profiler.hold import HIDE_CAP, HIDE_LEAD, Hold, next_lead
from pipecast.measuring.profiler.measure import split_call
from pipecast.measuring.profiler.profiler import ProfileOptions, profile_model
from pipecast.values.data import get_spec
from pipecast.values.models import Workload
from pipecast.values.profile import Profile, robust
from pipecast.values.profile.types import BlockCost

FAST = ProfileOptions(micro_batch_sizes=(2, 4), warmup=1, repeats=3)


def test_robust_drops_outliers() -> None:
    r = robust([1.0, 1.1, 0.9, 1.0, 1.05, 9.0])
    assert r.dropped == 1 and r.median == pytest.approx(1.0)
    assert robust([2.0]).median == 2.0


def test_profile_measures_every_block_and_size() -> None:
    """Every block at every size gets positive, finite times and the bytes its shapes give;
    no assertion compares two measured times, which a busy machine can reorder."""
    w = Workload(model="lenet5", dataset="mnist")
    p = profile_model(w.build(), w.spec, FAST, model_name="lenet5")
    assert p.num_blocks == 12 and p.micro_batch_sizes == (2, 4)
    for i, block in enumerate(p.blocks):
        for mb in (2, 4):
            c = block.costs[mb]
            assert 0 < c.forward < math.inf and 0 < c.backward < math.inf
            assert c.output_bytes > 0
        assert block.costs[4].output_bytes == 2 * block.costs[2].output_bytes
        if i == 0:
            assert block.costs[4].backward_weight == 0  # stage 0 does all in B
    # conv1 on MNIST keeps its (B, 1, 28, 28) fp32 input for the weight gradient
    assert p.blocks[0].costs[4].saved_bytes == 4 * 28 * 28 * 4
    assert p.param_bytes == 61_706 * 4
    assert p.loss[4][0] > 0
    assert 0 < p.host.reference < math.inf  # how fast the host ran while profiling
    assert Profile.from_json(p.to_json()).host.reference == p.host.reference
    assert 0 < p.host.issue < math.inf  # torch's host work on a tiny model, timed
    assert Profile.from_json(p.to_json()).host.issue == p.host.issue
    # where it was taken, as the probe names its machine
    assert p.host.machine == hostspeed.machine() != ""
    assert Profile.from_json(p.to_json()).host.machine == p.host.machine
    # and on which CPU model its host costs were read
    assert p.host.cpu == hostspeed.cpu_model() != ""
    assert Profile.from_json(p.to_json()).host.cpu == p.host.cpu
    # the host's speed beside each size's host costs, a reading of the same kind
    assert sorted(p.host.size_issue) == [2, 4]
    assert all(0 < v < math.inf for v in p.host.size_issue.values())
    assert Profile.from_json(p.to_json()).host.size_issue == p.host.size_issue
    # tensors torch's DDP handles one by one: LeNet-5's 5 layers x (weight, bias), no buffers
    assert [b.param_tensors for b in p.blocks if b.param_tensors] == [2] * 5
    assert sum(b.buffer_tensors for b in p.blocks) == 0
    assert Profile.from_json(p.to_json()).blocks[0].param_tensors == 2
    # what one sample's input and target take: a 28 x 28 fp32 image, one int64 label
    assert (p.input_bytes_per_sample, p.target_bytes_per_sample) == (28 * 28 * 4, 8)
    assert Profile.from_json(p.to_json()).target_bytes_per_sample == 8


def test_a_samples_target_takes_its_kinds_bytes() -> None:
    """Labels and token ids are int64; a regression target is the input's shape in the
    profile's float size."""
    assert get_spec("cifar10").target_bytes(4) == 8
    embeddings = get_spec("embeddings")
    n = 1
    for d in embeddings.sample_shape:
        n *= d
    assert embeddings.target_bytes(2) == 2 * n
    tokens = get_spec("tokens")  # next-token ids, one per position
    assert tokens.target_bytes(4) == 8 * tokens.sample_shape[0]


def test_profile_counts_buffers() -> None:
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(10))
    model(torch.zeros(1, 1, 28, 28))
    p = profile_model(model, get_spec("mnist"), ProfileOptions(micro_batch_sizes=(2,), repeats=1))
    assert [b.buffer_tensors for b in p.blocks] == [0, 3, 0, 0]  # mean, var, batches seen
    assert [b.param_tensors for b in p.blocks] == [2, 2, 0, 2]


def test_profile_counts_the_parameters_whose_gradients_take_large_segments() -> None:
    """A graphed slot's allocator serves tensors over 1 MiB from large segments: the profile
    keeps each block's bytes of such parameters (a 1024 x 320 fp32 weight is 1.25 MiB; its
    bias, and a 256 x 1024 weight of exactly 1 MiB, are small requests)."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.Linear(1024, 320), nn.ReLU())
    model.append(nn.Linear(320, 256, bias=False)).append(nn.Linear(256, 1024))
    p = profile_model(model, get_spec("mnist"), ProfileOptions(micro_batch_sizes=(2,), repeats=1))
    sizes = [[t.numel() * 4 for t in b.parameters()] for b in model]
    assert [b.large_param_bytes for b in p.blocks] == [0, 784 * 1024 * 4, 1024 * 320 * 4, 0, 0, 0]
    assert sizes[5] == [256 * 1024 * 4, 1024 * 4]  # the last weight is exactly 1 MiB: small
    assert Profile.from_json(p.to_json()).blocks[1].large_param_bytes == 784 * 1024 * 4


def test_profile_counts_each_blocks_forward_flops_per_sample() -> None:
    """Counted, not timed: 2 FLOPs per multiply-add of each Linear for one sample, whatever
    sizes were profiled; none for a flatten or a ReLU (values.profile.flops)."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Linear(32, 10))
    p = profile_model(model, get_spec("mnist"), ProfileOptions(micro_batch_sizes=(2,), repeats=1))
    assert [b.forward_flops for b in p.blocks] == [0, 2 * 784 * 32, 0, 2 * 32 * 10]
    assert Profile.from_json(p.to_json()).forward_flops == 2 * (784 * 32 + 32 * 10)


def test_host_issue_reading_leaves_the_global_generator_alone() -> None:
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    hostspeed._models.clear()  # the first reading builds its model
    assert hostspeed.issue(repeats=1) > 0
    assert torch.equal(torch.rand(3), expected)


def test_saved_bytes_count_a_shared_tensor_once() -> None:
    # Linear(8->16) saves its input; ReLU saves its output; the next Linear saves that same
    # output as its input: the ReLU output must be counted once.
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    spec = get_spec("embeddings", seq_len=1, width=8)
    p = profile_model(model, spec, ProfileOptions(micro_batch_sizes=(10,), warmup=0, repeats=1))
    relu_out = 10 * 1 * 16 * 4
    assert p.blocks[1].costs[10].saved_bytes == relu_out
    assert p.blocks[2].costs[10].saved_bytes == 0
    assert not p.blocks[2].input_counted
    stage = p.stage(1, 3, 10)  # received input (Linear output) + ReLU output
    assert stage.activation_bytes == relu_out + relu_out
    assert p.stage(2, 3, 10).activation_bytes == relu_out  # only the held input


def test_profile_json_roundtrip_and_interpolation(tmp_path: Path) -> None:
    w = Workload(model="lenet5", dataset="mnist")
    p = profile_model(w.build(), w.spec, FAST, model_name="lenet5")
    path = tmp_path / "p.json"
    p.save(str(path))
    q = Profile.load(str(path))
    assert q.blocks == p.blocks and q.micro_batch_sizes == p.micro_batch_sizes
    mid = q.cost(3, 3)
    lo, hi = q.cost(3, 2), q.cost(3, 4)
    assert min(lo.forward, hi.forward) <= mid.forward <= max(lo.forward, hi.forward)
    assert mid.output_bytes * 2 == lo.output_bytes * 3
    whole = q.stage(0, q.num_blocks, 4)
    assert whole.forward == pytest.approx(
        sum(q.cost(i, 4).forward for i in range(q.num_blocks)) + q.loss[4][0]
    )
    with pytest.raises(DataError, match="holds a 'cluster'"):
        Profile.from_json('{"kind": "cluster", "version": 1}')
    with pytest.raises(DataError, match="holds JSON without a 'kind', not a 'profile'"):
        Profile.from_json("{}")
    with pytest.raises(DataError, match="holds a JSON list, not a 'profile'"):
        Profile.from_json("[1, 2]")


def test_bad_block_names_block_and_shape() -> None:
    model = nn.Sequential(nn.Flatten(), nn.Linear(5, 3))
    with pytest.raises(ShapeError, match=r"block 1 \(Linear\) fails on input of shape \(2, 784\)"):
        profile_model(model, get_spec("mnist"), FAST)


def test_missing_device() -> None:
    with pytest.raises(DeviceError, match="is not there"):
        profile_model(
            nn.Sequential(nn.Flatten()), get_spec("mnist"), ProfileOptions(device="cuda:7")
        )


def test_profile_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "lenet.json"
    code = main(
        [
            "profile",
            "--model",
            "lenet5",
            "--micro-batch-sizes",
            "2",
            "--repeats",
            "2",
            "-o",
            str(out),
        ]
    )
    assert code == 0 and out.exists()
    assert "Conv2d" in capsys.readouterr().out
    assert Profile.load(str(out)).model == "lenet5"
    assert Profile.load(str(out)).host.windows == 1  # a CPU reads its host in one window
    assert main(["profile", "--model", "lenet5", "--micro-batch-sizes", "0"]) == 2
    one = ["profile", "--model", "lenet5", "--micro-batch-sizes", "2", "--repeats", "2"]
    with pytest.raises(SystemExit, match="2"):  # refused as the arguments are read
        main([*one, "--host-windows", "0"])
    assert "--host-windows takes a count of at least 1" in capsys.readouterr().err


def test_bf16_profile_halves_bytes() -> None:
    w = Workload(model="lenet5", dataset="mnist")
    fp32 = profile_model(w.build(), w.spec, ProfileOptions(micro_batch_sizes=(4,), repeats=1))
    bf16 = profile_model(
        w.build(), w.spec, ProfileOptions(micro_batch_sizes=(4,), repeats=1, dtype="bf16")
    )
    assert bf16.param_bytes * 2 == fp32.param_bytes
    assert bf16.blocks[3].costs[4].output_bytes * 2 == fp32.blocks[3].costs[4].output_bytes
    assert torch.get_default_dtype() == torch.float32


def test_profiler_measures_what_b_keeps_for_w() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8))
    spec = get_spec("embeddings", seq_len=1, width=8)
    p = profile_model(model, spec, ProfileOptions(micro_batch_sizes=(10,), warmup=0, repeats=1))
    assert p.blocks[0].costs[10].held_bytes == 0  # the first block does all its work in B
    assert p.blocks[1].costs[10].held_bytes == 10 * 8 * 4  # the gradient of its (10, 8) output


def test_split_call_is_only_measured_where_the_host_is_modelled() -> None:
    """On a CPU the host does the work itself: no B-call cost to share out."""
    options = ProfileOptions(device="cpu", micro_batch_sizes=(2,), warmup=0, repeats=1)
    assert split_call(torch.device("cpu"), torch.float32, options) == 0.0


def test_hostspeed_reference_is_the_median_time_of_the_fixed_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reading is the loop's time, the median of its repeats. On a clock that moves only
    while the loop runs, 1, 5 and 2 s an iteration in three repeats of 10 iterations, the
    repeats read 10, 50 and 20 s and the reading is 20 s (not their mean, 26.7, nor the
    fastest, 10), whatever else the machine is doing."""
    clock = [0.0]
    per_iteration = iter([1.0, 5.0, 2.0])

    def ticking(n: int) -> Iterator[int]:
        tick = next(per_iteration)
        for i in range(n):
            clock[0] += tick
            yield i

    def counted(n: int) -> Iterator[int]:  # the loop's 10 iterations tick; the repeats not
        return ticking(n) if n == 10 else iter(range(n))

    monkeypatch.setattr(hostspeed, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(hostspeed, "range", counted, raising=False)
    monkeypatch.setattr(hostspeed, "ITERATIONS", 10)
    assert hostspeed.reference(repeats=3) == 20.0


class _SlowBackward(torch.autograd.Function):
    """The identity, whose backward sleeps `delay` seconds (a sleep is never shorter)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, delay: float) -> torch.Tensor:
        ctx.delay = delay
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(ctx.delay)
        return grad, None


class _Slow(nn.Module):
    """A Linear whose backward takes at least `delay` seconds."""

    def __init__(self, n_in: int, n_out: int, delay: float) -> None:
        super().__init__()
        self.linear, self.delay = nn.Linear(n_in, n_out), delay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _SlowBackward.apply(self.linear(x), self.delay)
        return out


def test_in_context_backward_is_marked_block_by_block() -> None:
    """Gradient hooks mark each block's backward inside one whole backward, in-place ReLUs
    included: every block gets a time, and each block's sleep falls in its own: at least
    20 ms in the first Linear's, 40 ms in the second's, 60 ms in the whole backward. Only
    lower bounds, which a busy machine cannot break."""
    torch.manual_seed(0)
    blocks = [
        _Slow(16, 16, 0.02),
        nn.ReLU(inplace=True),
        _Slow(16, 64, 0.04),
        nn.ReLU(inplace=True),
        nn.Linear(64, 10),
    ]
    x, target = torch.randn(8, 16), torch.randint(0, 10, (8,))
    options = ProfileOptions(device="cpu", micro_batch_sizes=(8,), warmup=0, repeats=2)
    ctx = in_situ(blocks, x, target, nn.functional.cross_entropy, torch.device("cpu"), options)
    assert ctx.backward_blocks is not None and len(ctx.backward_blocks) == 5
    assert all(0 < t < math.inf for t in ctx.backward_blocks)
    assert ctx.backward_blocks[0] >= 0.02 and ctx.backward_blocks[2] >= 0.04
    assert ctx.backward >= 0.06


def test_hold_before_a_hidden_pass_grows_until_it_outlasts_the_hosts_issuing() -> None:
    """hide_issue: a hold lasts 1.5x the host's last issue time, never shrinks, and at least
    doubles after one that fell short of the host."""
    assert next_lead(0.0, 2e-3, hidden=False) == pytest.approx(HIDE_LEAD * 2e-3)
    assert next_lead(3e-3, 1e-3, hidden=True) == pytest.approx(3e-3)  # never shorter
    assert next_lead(3e-3, 4e-3, hidden=True) == pytest.approx(HIDE_LEAD * 4e-3)
    assert next_lead(3e-3, 1e-3, hidden=False) == pytest.approx(6e-3)  # fell short: double
    assert next_lead(3e-3, 5e-3, hidden=False) == pytest.approx(HIDE_LEAD * 5e-3)
    assert HIDE_LEAD > 1


def test_a_hold_that_can_never_outlast_its_host_gives_up_instead_of_growing() -> None:
    """A pass whose host waits on its device takes the host the hold plus its own issuing:
    the hold grows to HIDE_CAP x the first pass's issue time and no further, and then
    hiding is given up. A host that the hold does outlast keeps it."""
    synced = Hold()
    assert not synced.after(issued=1e-3, held=0.0)  # the first pass has no hold
    leads = []
    while not synced.given_up:
        leads.append(synced.lead)
        assert len(leads) < 20, "the hold grew without end"
        synced.after(issued=synced.lead + 1e-3, held=synced.lead)
    assert leads[0] == pytest.approx(HIDE_LEAD * 1e-3)
    assert max(leads) == pytest.approx(HIDE_CAP * 1e-3)
    assert leads == sorted(leads)

    plain = Hold()
    plain.after(issued=1e-3, held=0.0)
    for _ in range(30):
        assert plain.after(issued=1e-3, held=plain.lead)
    assert not plain.given_up and plain.lead == pytest.approx(HIDE_LEAD * 1e-3)


def test_hidden_passes_give_device_times_and_plain_passes_host_times() -> None:
    """Behind a held device the host waits for room in the launch queue, so a hidden pass's
    host times are not the host's own: the merged context takes only its device times, and
    nothing from passes whose issuing was not hidden."""
    plain = Context(
        forward=[3e-4, 2e-4],
        backward=9e-4,
        host_forward=[3e-4, 2e-4],
        host_backward=5e-4,
        backward_blocks=[5e-4, 4e-4],
    )
    held = Context(
        forward=[1e-4, 5e-5],
        backward=4e-4,
        host_forward=[6e-4, 4e-4],
        host_backward=9e-4,
        backward_blocks=[2e-4, 2e-4],
        issue_hidden=True,
    )
    merged = plain.device_from(held)
    assert merged.issue_hidden
    assert (merged.forward, merged.backward, merged.backward_blocks) == (
        held.forward,
        held.backward,
        held.backward_blocks,
    )
    assert (merged.host_forward, merged.host_backward) == (plain.host_forward, 5e-4)
    assert plain.device_from(replace(held, issue_hidden=False)) == plain


def test_device_times_come_from_held_passes_only_where_every_size_hid() -> None:
    """Device times interpolate between sizes, so a profile takes them from the passes
    behind a hold at every size or at none: one size that could not be hidden leaves the
    plain passes' device times everywhere. Host times are always the plain passes'."""

    def ctx(t: float, hidden: bool = False) -> Context:
        return Context(
            forward=[t],
            backward=2 * t,
            host_forward=[3 * t],
            host_backward=4 * t,
            issue_hidden=hidden,
        )

    plain = {4: ctx(1e-3), 8: ctx(2e-3)}
    held = {4: ctx(1e-4, hidden=True), 8: ctx(2e-4, hidden=True)}
    kept = in_place(plain, held)
    assert [kept[mb].forward for mb in (4, 8)] == [[1e-4], [2e-4]]
    assert [kept[mb].host_forward for mb in (4, 8)] == [[3e-3], [6e-3]]
    assert all(c.issue_hidden for c in kept.values())
    assert in_place(plain, {**held, 8: ctx(2e-4)}) == plain  # size 8 could not be hidden
    assert in_place(plain, {}) == plain  # hide_issue off, or a CPU


def test_hidden_issue_is_cuda_only_and_recorded_in_the_profile() -> None:
    """On a CPU the host does the work itself: hide_issue changes nothing there, and the
    profile says its device times were not taken with the issuing hidden."""
    torch.manual_seed(0)
    blocks = [nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10)]
    x, target = torch.randn(64, 32), torch.randint(0, 10, (64,))
    options = ProfileOptions(device="cpu", micro_batch_sizes=(64,), warmup=1, repeats=3)
    cpu = torch.device("cpu")
    hidden = in_situ_hidden(blocks, x, target, nn.functional.cross_entropy, cpu, options)
    assert hidden is not None
    assert len(hidden.forward) == 3 and all(t > 0 for t in hidden.forward)
    assert not hidden.issue_hidden
    w = Workload(model="lenet5", dataset="mnist")
    p = profile_model(w.build(), w.spec, replace(FAST, hide_issue=True), model_name="lenet5")
    assert not p.issue_hidden
    back = Profile.from_json(replace(p, issue_hidden=True).to_json())
    assert back.issue_hidden


def _two_blocks_marked_3_to_1() -> tuple[BlockCost, Context]:
    """A block costing 2 s of backward alone (B 0.5, W 1.5), and a context of two of them
    whose whole backward took 9 s, the first marked at 3x the second."""
    alone = BlockCost(
        forward=1.0,
        backward_input=0.5,
        backward_weight=1.5,
        backward=2.0,
        output_bytes=1,
        saved_bytes=1,
    )
    ctx = Context(
        forward=[1.0, 1.0],
        backward=9.0,
        host_forward=[0.0, 0.0],
        host_backward=0.0,
        backward_blocks=[3.0, 1.0],
    )
    return alone, ctx


def test_rescale_shares_the_backward_as_marked_in_context() -> None:
    """Alone the two blocks' backwards cost the same; in context the first took 3x the
    second: the context's total is shared 3 : 1, each block keeping its own B : W ratio."""
    alone, ctx = _two_blocks_marked_3_to_1()
    costs = [{8: alone}, {8: alone}]
    rescale(costs, 8, ctx, loss_backward=1.0)
    assert costs[0][8].backward == pytest.approx(6.0)
    assert costs[1][8].backward == pytest.approx(2.0)
    assert costs[0][8].backward_input == pytest.approx(1.5)  # 1 : 3 as alone
    unmarked = [{8: alone}, {8: alone}]
    rescale(unmarked, 8, replace(ctx, backward_blocks=None), loss_backward=1.0)
    assert unmarked[0][8].backward == unmarked[1][8].backward == pytest.approx(4.0)


def test_a_contextual_backward_shorter_than_the_loss_keeps_the_blocks_own() -> None:
    """The loss's backward read at 10 s, the whole model's at 9 (the two read apart while
    another process held the cores): nothing is left for the blocks, which keep their 2 s
    each as timed alone (shared 3 : 1 as marked: 3 and 1), not 0."""
    alone, ctx = _two_blocks_marked_3_to_1()
    costs = [{8: alone}, {8: alone}]
    rescale(costs, 8, ctx, loss_backward=10.0)
    assert costs[0][8].backward == pytest.approx(3.0)
    assert costs[1][8].backward == pytest.approx(1.0)
    assert costs[1][8].backward_weight == pytest.approx(0.75)  # 3 : 1 W to B, as alone


def test_profile_prices_the_runtimes_own_backward_calls() -> None:
    """The profile times B, W and BW with the very functions the runtime's engine issues,
    so a change to how the runtime makes its autograd calls moves the prices with it."""
    from pipecast.measuring.profiler import measure
    from pipecast.runtime import backward, engine, micro_backward, weight_batch

    for name in ("backward_full", "backward_input", "backward_weights"):
        assert getattr(measure, name) is getattr(backward, name)
    for name in ("backward_full", "backward_input_segments"):
        assert getattr(micro_backward, name) is getattr(backward, name)
    # the engine's W goes through run_group, which runs one micro-batch's by backward_weights
    assert engine.run_group is measure.run_group is weight_batch.run_group
    assert weight_batch.backward_weights is backward.backward_weights


def test_windows_take_each_readings_median_over_windows() -> None:
    """Three windows, one of them in a slow spell (host readings 2x) and one with a block
    unmarked: every reading is its median over the windows, so the slow spell drops out,
    and the per-block backward survives only where every window marked it."""

    def window(host: float, marked: bool = True) -> Context:
        return Context(
            forward=[1e-3, 2e-3],
            backward=4e-3,
            host_forward=[host, 2 * host],
            host_backward=3 * host,
            backward_blocks=[1e-3, 3e-3] if marked else None,
        )

    fast, slow = window(1e-3), window(2e-3)
    kept = across_windows([fast, slow, window(1.1e-3)])
    assert kept.host_forward == pytest.approx([1.1e-3, 2.2e-3])
    assert kept.host_backward == pytest.approx(3.3e-3)
    assert kept.forward == [1e-3, 2e-3] and kept.backward_blocks == [1e-3, 3e-3]
    assert across_windows([fast]) is fast
    assert across_windows([fast, slow, window(1e-3, marked=False)]).backward_blocks is None
    with pytest.raises(ValueError):
        across_windows([])


def test_profile_reads_the_host_in_windows_spread_over_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """host_windows=3: every size's plain passes run once before the per-block runs, once at
    the size's turn and once after all of them; one window keeps the size's turn only, and
    so does a CPU, whose host is not modelled (here the CPU stands in for a GPU)."""
    from pipecast.measuring.profiler import profiler

    calls: list[tuple[int, int]] = []  # (micro-batch, block runs so far)
    measured = [0]
    real_in_situ, real_measure = profiler.in_situ, profiler.measure_block

    def counting_in_situ(blocks: list[nn.Module], x: torch.Tensor, *a: object) -> Context:
        calls.append((x.shape[0], measured[0]))
        return real_in_situ(blocks, x, *a)  # type: ignore[arg-type]

    def counting_measure(*a: object, **k: object) -> dict[str, float]:
        measured[0] += 1
        return real_measure(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(profiler, "in_situ", counting_in_situ)
    monkeypatch.setattr(profiler, "measure_block", counting_measure)
    w = Workload(model="lenet5", dataset="mnist")
    options = replace(FAST, micro_batch_sizes=(2, 4), host_windows=3)
    assert profile_model(w.build(), w.spec, options, model_name="lenet5").host.windows == 1
    assert [mb for mb, _ in calls] == [2, 4]  # a CPU: its host costs are 0 anyway
    calls.clear()
    measured[0] = 0
    monkeypatch.setattr(profiler, "HOST_MODELLED", ("cuda", "cpu"))
    profile = profile_model(w.build(), w.spec, options, model_name="lenet5")
    back = Profile.from_json(profile.to_json())
    assert back.host.windows == 3
    assert {mb: len(v) for mb, v in back.host.window_host.items()} == {2: 3, 4: 3}
    blocks = measured[0] // 2
    assert sorted(mb for mb, _ in calls) == [2, 2, 2, 4, 4, 4]
    assert calls[:2] == [(2, 0), (4, 0)]  # before any block ran
    assert calls[-2:] == [(2, 2 * blocks), (4, 2 * blocks)]  # after every block ran
    assert (2, blocks) in calls and (4, 2 * blocks) in calls[2:4]

    calls.clear()
    profile_model(w.build(), w.spec, replace(options, host_windows=1), model_name="lenet5")
    assert [mb for mb, _ in calls] == [2, 4]
    with pytest.raises(ConfigError, match="host windows"):
        profile_model(w.build(), w.spec, replace(options, host_windows=0), model_name="lenet5")


def test_profile_output_says_how_far_the_host_windows_lay_apart(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A GPU profile's windows (here written by hand onto a CPU profile): the spread of each
    size's whole-model host times, and the widest printed under the table."""
    from pipecast.cli.profile_verb import print_profile

    w = Workload(model="lenet5", dataset="mnist")
    p = profile_model(w.build(), w.spec, FAST, model_name="lenet5")
    assert p.host.window_spread() == {}  # one window on a CPU, and its host time is 0
    print_profile(p)
    assert "windows" not in capsys.readouterr().out
    windows = {2: (4e-3, 3e-3, 5e-3), 4: (4e-3, 4.4e-3, 4e-3)}
    gpu = replace(p, host=replace(p.host, windows=3, window_host=windows))
    assert gpu.host.window_spread() == pytest.approx({2: 0.5, 4: 0.1})
    print_profile(gpu)
    out = " ".join(capsys.readouterr().out.split())
    assert "moved by up to 50% between 3 windows (micro-batch 2)" in out


def test_compile_seconds_time_the_passes_that_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Profile.compile_seconds is the first pass at each size: every graph the passes with
    gradients use is compiled there, also where host windows run whole-model passes before
    the per-block runs (a GPU; here the CPU stands in for one). The blocks compile with a
    backend that runs dynamo's graphs as they are: the same graphs, in milliseconds."""
    from pipecast.measuring.profiler import profiler
    from pipecast.runtime import compiled

    inside = [""]
    compiles: list[str] = []  # per graph compiled: where ("": neither)

    def backend(gm: torch.fx.GraphModule, _: list[Any]) -> Any:
        compiles.append(inside[0])
        return gm.forward

    real_pass, real_check = profiler._Profiling.compile_pass, profiler._check_shapes

    def compile_pass(self: Any, size: int) -> None:
        inside[0] = "compile pass"
        real_pass(self, size)
        inside[0] = ""

    def check_shapes(*a: Any) -> None:  # without gradients: graphs the passes don't use
        inside[0] = "shapes"
        real_check(*a)
        inside[0] = ""

    monkeypatch.setattr(compiled, "_BACKENDS", {})
    monkeypatch.setattr(compiled, "backend", lambda **_: backend)
    monkeypatch.setattr(compiled, "compile_loss", lambda loss_fn, _: loss_fn)
    monkeypatch.setattr(profiler._Profiling, "compile_pass", compile_pass)
    monkeypatch.setattr(profiler, "_check_shapes", check_shapes)
    monkeypatch.setattr(profiler, "HOST_MODELLED", ("cuda", "cpu"))
    torch._dynamo.reset()
    w = Workload(model="lenet5", dataset="mnist")
    options = replace(FAST, compile="blocks", host_windows=3)
    profile = profile_model(w.build(), w.spec, options, model_name="lenet5")
    torch._dynamo.reset()
    assert profile.host.windows == 3
    assert "shapes" in compiles and "compile pass" in compiles
    assert set(compiles) == {"shapes", "compile pass"}, compiles
