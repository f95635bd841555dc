"""PipeDream's weight stashing, real training accuracy, and failure handling."""

from __future__ import annotations

import gc
import os
import re
import weakref
from dataclasses import replace
from functools import partial
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tests.runtime.helpers import fault, merged, pipeline_job, run

from pipecast.errors import ConfigError, PipecastError
from pipecast.planning.partition import from_boundaries
from pipecast.planning.schedules import make_plan
from pipecast.runtime.config import RunConfig
from pipecast.runtime.engine import PipelineEngine
from pipecast.runtime.env_defaults import QUIET_ENV
from pipecast.runtime.job import TrainJob
from pipecast.runtime.launch import Context, RankFailed, free_port, process_group, spawn
from pipecast.runtime.worker import own_share, run_rank
from pipecast.values.data import load_digits_as_mnist
from pipecast.values.data.loss import loss_for
from pipecast.values.data.synthetic import synthetic_batch
from pipecast.values.models import Workload

LENET = Workload(model="lenet5", dataset="mnist")


@pytest.mark.slow
def test_pipedream_weight_stashing() -> None:
    """Stage s's forward of micro-batch j uses the weights after every backward that precedes
    it on that stage; its backward uses those same weights, and updates come one per
    micro-batch. A sequential replay of exactly that must give the final weights."""
    plan = make_plan("pipedream", 2, 4)
    result = run(pipeline_job(LENET, "pipedream", 2, 4, [0, 6, 12], batch=8))
    versions = {}
    for r in result.reports:
        versions.update(r.versions)
    for stage, log in versions.items():
        rank_actions = plan.actions[plan.stage_to_rank[stage]]
        expected = []
        for j in range(4):
            position = rank_actions.index(
                next(a for a in rank_actions if a.stage == stage and a.kind == "F" and a.mb == j)
            )
            done = sum(1 for a in rank_actions[:position] if a.stage == stage and a.kind == "BW")
            expected.append((j, done))
        assert log == expected
    assert versions[0] != [(j, 0) for j in range(4)], "stage 0 must see updated weights"

    # replay: per stage, keep the weight version each micro-batch's forward saw
    torch.manual_seed(0)
    model = LENET.build()
    x, y = synthetic_batch(LENET.spec, 8, seed=0)
    xs, ys = torch.tensor_split(x, 4), torch.tensor_split(y, 4)
    stages = [model[0:6], model[6:12]]
    history = [[{n: p.detach().clone() for n, p in s.named_parameters()}] for s in stages]
    loss_fn = loss_for(LENET.spec)
    # the order of backwards over micro-batches is the same on both stages (1F1B order)
    for j in range(4):
        w0 = history[0][versions[0][j][1]]
        w1 = history[1][versions[1][j][1]]
        p0 = {n: t.clone().requires_grad_() for n, t in w0.items()}
        p1 = {n: t.clone().requires_grad_() for n, t in w1.items()}
        h = torch.func.functional_call(stages[0], p0, (xs[j],))
        out = torch.func.functional_call(stages[1], p1, (h,))
        loss = loss_fn(out, ys[j]) * (len(ys[j]) / 8)
        g0 = torch.autograd.grad(loss, list(p0.values()) + list(p1.values()))
        for k, (params, grads) in enumerate(((p0, g0[: len(p0)]), (p1, g0[len(p0) :]))):
            latest = history[k][-1]
            history[k].append(
                {n: latest[n] - 0.1 * g for (n, _), g in zip(params.items(), grads, strict=True)}
            )
    final = {**history[0][-1], **history[1][-1]}
    got = merged(result, "params")
    for name, want in final.items():
        assert torch.allclose(got[name], want, rtol=1e-5, atol=1e-6), name


@pytest.mark.slow
def test_digits_pipeline_matches_single_process_accuracy() -> None:
    digits = Workload(model="lenet5", dataset="digits")
    steps, batch = 80, 64
    config = RunConfig(lr=3e-3, optimizer="adam", timeout_s=120)
    job = TrainJob(
        plan=make_plan("1f1b", 2, 4),
        partition=from_boundaries([0, 6, 12]),
        batch=batch,
        workload=digits,
        config=config,
        steps=steps,
        warmup_steps=0,
        capture=True,
    )
    result = run(TrainJob(**{**job.__dict__}))
    train, test = load_digits_as_mnist().split(0.8, seed=0)

    def accuracy(params: dict[str, torch.Tensor]) -> float:
        model = digits.build()
        model.load_state_dict(params)
        with torch.no_grad():
            return (model(test.inputs).argmax(1) == test.targets).float().mean().item()

    torch.manual_seed(0)
    single = digits.build()
    opt = torch.optim.Adam(single.parameters(), lr=3e-3)
    it, epoch, done = iter(()), 0, 0
    while done < steps:
        try:
            x, y = next(it)
        except StopIteration:
            it, epoch = train.batches(batch, seed=epoch), epoch + 1
            continue
        opt.zero_grad()
        F.cross_entropy(single(x), y).backward()
        opt.step()
        done += 1
    single_acc = accuracy({n: p.detach() for n, p in single.state_dict().items()})
    pipe_acc = accuracy(merged(result, "params"))
    assert single_acc > 0.9
    assert abs(pipe_acc - single_acc) <= 0.01


@pytest.mark.slow
def test_killed_rank_makes_the_others_report_within_the_timeout() -> None:
    job = pipeline_job(
        LENET,
        "1f1b",
        3,
        4,
        [0, 4, 8, 12],
        batch=8,
        config=RunConfig(lr=0.1, timeout_s=8),
        steps=3,
        capture=False,
    )
    job = replace(job, before_step=partial(fault, 1, 1, "die"))  # rank 1 dies at step 1
    # how soon they report depends on the machine's load: no bound here (a run that never
    # reports is stopped by the suite's timeout); a survivor's report is what must come
    with pytest.raises(RankFailed) as err:
        run(job)
    first = str(err.value).splitlines()[0]
    assert first.startswith(("rank 0", "rank 2")), first  # a survivor's report, not the death
    assert "lost contact" in first or "transfer failed" in first or "no progress" in first


@pytest.mark.slow
def test_hung_rank_makes_the_others_report_where_they_wait() -> None:
    job = pipeline_job(
        LENET,
        "1f1b",
        2,
        4,
        [0, 6, 12],
        batch=8,
        config=RunConfig(lr=0.1, timeout_s=4),
        steps=3,
        capture=False,
    )
    job = replace(job, before_step=partial(fault, 1, 1, "hang"))
    with pytest.raises(RankFailed) as err:
        run(job)
    text = str(err.value)
    assert text.startswith("rank 0") and "made no progress" in text
    # after waiting out its 4 s, never sooner (a lower bound: load can only add to it)
    waited = re.search(r"made no progress for (\d+) s", text)
    assert waited is not None and int(waited.group(1)) >= 4, text
    assert "barrier before step 1" in text
    assert "rank 0 |" in text  # the plan's grid comes with the report


def test_bad_jobs_fail_before_any_process_starts() -> None:
    good = pipeline_job(LENET, "1f1b", 2, 4, [0, 6, 12], batch=8)
    with pytest.raises(ConfigError, match="partition has 3 stages, plan 1f1b has 2"):
        TrainJob(**{**good.__dict__, "partition": from_boundaries([0, 4, 8, 12])}).check()
    with pytest.raises(ConfigError, match="cannot feed"):
        TrainJob(**{**good.__dict__, "batch": 3}).check()
    with pytest.raises(PipecastError):
        from pipecast.values.plan import Plan, validate

        bad = Plan(
            **{**good.plan.__dict__, "actions": (good.plan.actions[0][1:], good.plan.actions[1])}
        )
        validate(bad)


def test_steps_report_the_hosts_time_per_action_kind() -> None:
    """Each step records how long the host spent issuing each kind of action: the kinds the
    rank's plan holds, and together no more than the whole action loop; how much of that
    went on posting transfers (every rank of a pipeline sends or receives); and of each
    kind's seconds, those the thread ran on a CPU (no more than the wall seconds)."""
    job = pipeline_job(LENET, "zb-h1", 2, 4, [0, 3, len(LENET.build("meta"))], steps=2)
    result = run(job)
    for report in result.reports:
        kinds = {a.kind for a in job.plan.actions[report.pipeline_rank]}
        for step in report.steps:
            transfer = step.host.pop("transfer")
            cpu = {k[4:]: step.host.pop(k) for k in list(step.host) if k.startswith("cpu_")}
            assert set(cpu) == kinds
            # thread_time ticks coarser than perf_counter on some kernels: a little slack
            assert all(0 < cpu[k] <= step.host[k] + 0.002 for k in kinds), (cpu, step.host)
            assert set(step.host) == kinds
            assert all(v > 0 for v in step.host.values())
            assert sum(step.host.values()) <= step.host_loop * 1.0001
            assert 0 < transfer < sum(step.host.values())
            assert step.host_loop <= step.seconds
            # the step's fixed costs around the loop, inside the step's time
            assert step.host_before > 0 and step.host_after > 0
            assert step.host_before + step.host_loop + step.host_after <= step.seconds


def _two_jobs(ctx: Context, job: TrainJob) -> tuple[list[bool], float | None, float | None]:
    """Runs `job` twice in this process with automatic collection off: whether the first
    job's engine was still alive when the second built its own, and each job's loss."""
    engines: list[weakref.ref[PipelineEngine]] = []
    earlier_alive: list[bool] = []
    original = PipelineEngine.__init__

    def init(self: PipelineEngine, *args: Any, **kwargs: Any) -> None:
        earlier_alive.extend(e() is not None for e in engines)
        original(self, *args, **kwargs)
        engines.append(weakref.ref(self))

    PipelineEngine.__init__ = init  # type: ignore[method-assign]
    gc.collect()
    gc.disable()
    try:
        first = run_rank(ctx, job)
        second = run_rank(ctx, job)
    finally:
        gc.enable()
        PipelineEngine.__init__ = original  # type: ignore[method-assign]
    return earlier_alive, first.steps[0].loss, second.steps[0].loss


def test_a_job_starts_after_the_last_jobs_engine_is_freed() -> None:
    """A finished job's engine (its stages, gradients, CUDA graphs) stays reachable from a
    reference cycle until a full collection; the next job in the process frees it before it
    builds its own, so that job's peak memory is its own. Automatic collection is off here:
    only the runtime's own can free it. So too in a launched rank, which holds what it
    started with frozen out of the collector (launch._worker): what its jobs make is not."""
    job = pipeline_job(LENET, "1f1b", 1, 2, [0, len(LENET.build("meta"))], steps=1)
    ctx = Context(rank=0, world=1, local_rank=0, backend="gloo", device=torch.device("cpu"))
    here = _two_jobs(ctx, job)
    (launched,) = spawn(_two_jobs, 1, (job,))
    for earlier_alive, first, second in (here, launched):
        assert earlier_alive == [False]
        assert first == pytest.approx(second)


def test_a_rank_keeps_only_its_share_of_the_batch() -> None:
    """Every rank draws the whole batch; it keeps the inputs only where it runs the first
    stage, the targets only where it runs the last, and of several replicas' batch a copy of
    its replica's share, so that the rest is freed rather than held by a view."""
    x, y = torch.arange(8.0).reshape(8, 1), torch.arange(8)
    assert own_share(x, y, first=False, last=False, replica=0, replicas=1) == (None, None)
    first, none = own_share(x, y, first=True, last=False, replica=0, replicas=1)
    assert none is None and first is not None and torch.equal(first, x)
    none, last = own_share(x, y, first=False, last=True, replica=0, replicas=1)
    assert none is None and last is not None and torch.equal(last, y)
    a, b = own_share(x, y, first=True, last=True, replica=1, replicas=2)
    assert a is not None and b is not None
    assert torch.equal(a, x[4:]) and torch.equal(b, y[4:])
    for part, whole in ((a, x), (b, y)):  # not a view that keeps the whole batch alive
        assert part.untyped_storage().data_ptr() != whole.untyped_storage().data_ptr()
        assert part.untyped_storage().nbytes() == whole.untyped_storage().nbytes() // 2


@pytest.mark.parametrize("preset", [None, "1"])
def test_ranks_quiet_the_p2p_serialization_warning_unless_the_user_set_it(
    monkeypatch: pytest.MonkeyPatch, preset: str | None
) -> None:
    (key,) = QUIET_ENV
    if preset is None:
        monkeypatch.delenv(key, raising=False)
    else:
        monkeypatch.setenv(key, preset)
    with process_group(0, 1, 0, "gloo", 30, init_method=f"tcp://127.0.0.1:{free_port()}"):
        assert os.environ[key] == (preset or "0")


@pytest.mark.parametrize(
    ("preset", "want"),
    [
        ({}, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
        ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"}, {}),
        ({"PYTORCH_ALLOC_CONF": "expandable_segments:False"}, {}),
    ],
)
def test_ranks_grow_expandable_segments_unless_the_user_set_the_allocator(
    monkeypatch: pytest.MonkeyPatch, preset: dict[str, str], want: dict[str, str]
) -> None:
    """Where neither of torch's allocator variables is set, a rank runs with expandable
    segments (what the memory model predicts against); a user's own setting, under either
    name, is left as it is and no other is added."""
    from pipecast.runtime.env_defaults import ALLOCATOR_ENV

    for key in ALLOCATOR_ENV:
        monkeypatch.delenv(key, raising=False)
    for key, value in preset.items():
        monkeypatch.setenv(key, value)
    with process_group(0, 1, 0, "gloo", 30, init_method=f"tcp://127.0.0.1:{free_port()}"):
        seen = {k: os.environ[k] for k in ALLOCATOR_ENV if k in os.environ}
    assert seen == {**preset, **want}
