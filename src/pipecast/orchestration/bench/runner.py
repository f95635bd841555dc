"""The suite runner: executes configurations and writes each result as it completes.

Configurations run grouped by GPU count inside one spawned world per group (so process-group
start-up is paid once). Rank 0 writes every result to the store the moment it is measured. A
configuration that fails (out of memory, an error) is recorded and the next one starts; one that
hangs or kills the world is marked failed by the parent, which starts a fresh world for the
rest. Finished configurations are skipped on a rerun, so a suite resumes where it stopped.

Systems beyond pipecast's own and the baselines it ships (one device, DDP,
torch.distributed.pipelining) come in as `systems`: a name and a module-level function
(context, configuration) -> measurements, which travels to the ranks by pickle.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from pipecast.errors import PipecastError
from pipecast.measuring import hostspeed
from pipecast.orchestration.bench import baselines
from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.store import Store, environment
from pipecast.orchestration.bench.timing import (
    action_stats,
    gather_events,
    gather_floats,
    gather_peaks,
)
from pipecast.planning.partition.boundaries import placement_of
from pipecast.planning.schedules.generators import make_plan
from pipecast.runtime.config import RunConfig
from pipecast.runtime.job import TrainJob
from pipecast.runtime.launch import Backend, Context, RankFailed, all_gather_floats, spawn
from pipecast.runtime.watchdog import Watchdog
from pipecast.runtime.worker import release_earlier_jobs, run_rank
from pipecast.values.partition import from_boundaries


def pipecast_job(cfg: BenchConfig, *, capture: bool = False) -> TrainJob:
    stages = cfg.stages
    plan = make_plan(cfg.schedule if cfg.stages > 1 else "1f1b", stages, cfg.microbatches)
    bounds = list(cfg.boundaries) or None
    if bounds is None:
        raise PipecastError(f"{cfg.label()}: pipecast configurations need boundaries")
    part = from_boundaries(
        bounds,
        placement=placement_of(cfg.schedule),
        ranks=stages,
        replicas=cfg.replicas,
    )
    return TrainJob(
        plan=plan,
        partition=part,
        batch=cfg.batch,
        workload=cfg.workload,
        replicas=cfg.replicas,
        config=RunConfig(
            dtype=cfg.dtype,
            recompute=cfg.recompute,
            offload=cfg.offload,
            optimizer="adam" if cfg.accuracy_steps else cfg.optimizer,
            lr=3e-3 if cfg.accuracy_steps else 1e-4,
            record_events=cfg.device == "cuda",
            send_timing=cfg.send_timing,
            cut_backward=cfg.cut_backward,
            cuda_graphs=cfg.cuda_graphs,
            timeout_s=120,
        ),
        device="cuda" if cfg.device == "cuda" else "cpu",
        steps=cfg.accuracy_steps or cfg.steps,
        warmup_steps=0 if cfg.accuracy_steps else cfg.warmup,
        exact_init=cfg.device != "cuda" or bool(cfg.accuracy_steps),
        capture=capture,
    )


def _run_pipecast(ctx: Context, cfg: BenchConfig) -> dict[str, Any]:
    job = pipecast_job(cfg, capture=bool(cfg.accuracy_steps))
    report = run_rank(ctx, job)
    times = sorted(s.seconds for s in report.steps)
    result: dict[str, Any] = {
        "step_time": times[len(times) // 2],
        "peak_allocated": max((s.peak_allocated for s in report.steps), default=0),
        "peak_reserved": max((s.peak_reserved for s in report.steps), default=0),
    }
    result = gather_peaks(result, ctx.device)
    result["actions"] = gather_floats(action_stats(report.steps, report.events), ctx.device)
    if job.config.record_events:  # the last step's actions, to set beside the prediction's
        result["timeline"] = gather_events(report.events)
    if cfg.accuracy_steps:
        result["top1_error"] = _top1_error(ctx, cfg, report.params if report.replica == 0 else {})
    return result


def _top1_error(ctx: Context, cfg: BenchConfig, params: dict[str, torch.Tensor]) -> float | None:
    from pipecast.values.data.digits import load_digits_as_mnist

    gathered: list[Any] = [None] * ctx.world
    dist.gather_object(
        params, gathered if ctx.rank == 0 else None, dst=0
    ) if ctx.world > 1 else None
    if ctx.rank != 0:
        return None
    merged: dict[str, torch.Tensor] = {}
    for part in gathered if ctx.world > 1 else [params]:
        merged.update(part or {})
    model = cfg.workload.build()
    model.load_state_dict(merged)
    _, test = load_digits_as_mnist().split(0.8, seed=0)
    with torch.no_grad():
        correct = float((model(test.inputs).argmax(1) == test.targets).float().mean().item())
    return 1.0 - correct


SystemRun = Callable[[Context, BenchConfig], dict[str, Any]]
"""A system's measurement of one configuration on one rank (every rank calls it)."""


def run_config(
    ctx: Context, cfg: BenchConfig, systems: Mapping[str, SystemRun] | None = None
) -> dict[str, Any]:
    """Measure one configuration on this rank (every rank of the world calls this)."""
    systems = systems or {}
    if cfg.system == "pipecast":
        return _run_pipecast(ctx, cfg)
    if cfg.system == "single":
        return baselines.single_device(
            ctx,
            cfg.workload,
            cfg.batch,
            microbatches=cfg.microbatches,
            dtype=cfg.dtype,
            steps=cfg.steps,
            warmup=cfg.warmup,
        )
    if cfg.system == "ddp":
        return baselines.ddp(
            ctx, cfg.workload, cfg.batch, dtype=cfg.dtype, steps=cfg.steps, warmup=cfg.warmup
        )
    if cfg.system in systems:
        return systems[cfg.system](ctx, cfg)
    if cfg.system != "torch":
        raise PipecastError(f"{cfg.label()}: no system named {cfg.system!r} in this run")
    return baselines.torch_pipelining(
        ctx,
        cfg.workload,
        cfg.batch,
        list(cfg.boundaries),
        schedule=cfg.schedule,
        microbatches=cfg.microbatches,
        dtype=cfg.dtype,
        steps=cfg.steps,
        warmup=cfg.warmup,
    )


def _bench_rank(
    ctx: Context,
    configs: list[BenchConfig],
    store_path: str,
    predicted: dict[str, dict[str, Any]],
    env: dict[str, Any],
    timeout_s: float,
    deadline: float | None,
    again: bool = False,
    systems: Mapping[str, SystemRun] | None = None,
) -> None:
    """Measure each configuration once and record it. `again`: each has a record already;
    measure it once more and fold the measurement into that record (one more round)."""
    store = Store(store_path) if ctx.rank == 0 else None
    for cfg in configs:
        go = torch.tensor(
            [1 if deadline is None or time.time() < deadline else 0], device=ctx.device
        )
        if ctx.world > 1:  # rank 0's clock decides, so every rank stops at the same config
            dist.broadcast(go, src=0)
        if not go.item():
            if store is not None:
                print(f"[skipped] {cfg.label()}: out of time", flush=True)
            break
        if store is not None and not again:
            store.put(
                cfg.key, cfg.suite, "started", cfg.to_dict(), env, predicted=predicted.get(cfg.key)
            )
        measured, error = _measure(ctx, cfg, timeout_s, systems)
        if error and _lost_peer(error):
            if store is not None and not again:
                _record(store, cfg, env, predicted, None, error)
            raise SystemExit(1)  # this world is broken: the parent starts a fresh one
        if store is None:
            continue
        if not again:
            if measured is not None:
                measured["rounds"] = [measured["step_time"]]
            _record(store, cfg, env, predicted, measured, error)
        elif measured is not None:
            row = store.row(cfg.key)
            assert row is not None and row.measured is not None
            merged = _merged(row.measured, measured)
            merged["samples_per_second"] = cfg.batch / merged["step_time"]
            _record(store, cfg, env, predicted, merged, None)
        else:  # the rounds already measured stand
            print(f"[round failed] {cfg.label()}: {error}", flush=True)


def _measure(
    ctx: Context, cfg: BenchConfig, timeout_s: float, systems: Mapping[str, SystemRun] | None
) -> tuple[dict[str, Any] | None, str | None]:
    """One measurement of `cfg` on every rank: (what rank 0 records, None) when every rank
    succeeded, else (None, the error)."""
    watchdog = Watchdog(None, ctx.rank, ctx.rank, timeout_s)
    with watchdog:
        watchdog.at(None, f"running {cfg.label()}")
        error = None
        measured: dict[str, Any] = {}
        speed = issued = ahead = 0.0
        try:
            before = hostspeed.reference(repeats=3), hostspeed.issue(ctx.device)
            measured = run_config(ctx, cfg, systems)
            speed = statistics.median([before[0], hostspeed.reference(repeats=3)])
            issued = statistics.median([before[1], hostspeed.issue(ctx.device)])
            ahead = before[1]
        except (PipecastError, torch.OutOfMemoryError, RuntimeError) as exc:
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        release_earlier_jobs(ctx.device)
        if error and _lost_peer(error):
            return None, error
        ok = torch.tensor([0 if error else 1], device=ctx.device)
        if ctx.world > 1:
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if ok.item():  # how fast each rank's host ran around its measurement
            speeds = all_gather_floats([speed, issued, ahead], ctx.device)
            measured["host_reference"] = [r[0] for r in speeds]
            measured["host_issue"] = [r[1] for r in speeds]
            # read before the run started: what a prediction made just then could know
            measured["host_issue_before"] = [r[2] for r in speeds]
        watchdog.idle()
    if not ok.item() or error:
        return None, error or "failed on another rank"
    measured["samples_per_second"] = cfg.batch / measured["step_time"]
    return measured, None


def _merged(so_far: dict[str, Any], again: dict[str, Any]) -> dict[str, Any]:
    """A configuration's record after one more round: its step time the median of its
    rounds, each rank's peak memory and host readings the most and the median seen; the
    rest (per-action times, loss) as the first round measured them (samples/s: the
    caller's)."""
    rounds = [*so_far["rounds"], again["step_time"]]
    out = dict(so_far)
    out["rounds"] = rounds
    out["step_time"] = statistics.median(rounds)
    for key in ("peak_allocated", "peak_reserved"):
        if key in so_far and key in again:
            out[key] = [max(a, b) for a, b in zip(so_far[key], again[key], strict=True)]
    for key in ("host_reference", "host_issue", "host_issue_before"):
        if key in so_far and key in again:
            seen = [*so_far.get(f"{key}_rounds", [so_far[key]]), again[key]]
            out[f"{key}_rounds"] = seen
            out[key] = [statistics.median(rank) for rank in zip(*seen, strict=True)]
    return out


def _record(
    store: Store,
    cfg: BenchConfig,
    env: dict[str, Any],
    predicted: dict[str, dict[str, Any]],
    measured: dict[str, Any] | None,
    error: str | None,
) -> None:
    """Write one finished configuration (ok when measured, else failed) and say so."""
    status = "ok" if measured is not None else "failed"
    store.put(
        cfg.key, cfg.suite, status, cfg.to_dict(), env, measured, predicted.get(cfg.key), error
    )
    if measured is not None:
        print(f"[ok] {cfg.label()}: {measured['samples_per_second']:,.1f} samples/s", flush=True)
    else:
        print(f"[failed] {cfg.label()}: {error}", flush=True)


def _lost_peer(error: str) -> bool:
    return any(
        text in error
        for text in (
            "Connection closed",
            "Connection reset",
            "lost contact",
            "NCCL communicator was aborted",
        )
    )


def _groups(configs: list[BenchConfig]) -> dict[tuple[int, str], list[BenchConfig]]:
    """One world per GPU count and device, in the order the suite lists them."""
    groups: dict[tuple[int, str], list[BenchConfig]] = {}
    for cfg in configs:
        groups.setdefault((cfg.gpus, cfg.device), []).append(cfg)
    return groups


def _world_of(device: str) -> tuple[Backend, dict[str, Any]]:
    """The process-group backend and the environment record for a group on `device`."""
    if device == "cuda":
        return "nccl", environment("cuda")
    return "gloo", environment(device)


def _rounds_done(store: Store, key: str) -> int:
    """Rounds measured for `key` (-1: none that stands)."""
    row = store.row(key)
    if row is None or row.status != "ok" or not row.measured:
        return -1
    return len(row.measured.get("rounds", [row.measured["step_time"]]))


def run_suite(
    configs: list[BenchConfig],
    store_path: str,
    *,
    predicted: dict[str, dict[str, Any]] | None = None,
    timeout_s: float = 300.0,
    on_progress: Callable[[int, int], None] | None = None,
    deadline: float | None = None,
    rounds: int = 1,
    systems: Mapping[str, SystemRun] | None = None,
) -> Store:
    """Run every configuration not yet finished in the store; return the store. After
    `deadline` (a time.time() value) no new configuration starts; they stay pending. With
    `rounds` > 1, every configuration measured once is measured again, round after round
    over the whole suite, and keeps the median of its rounds: a host's speed moves in spells
    of seconds to minutes, so one measurement reads one spell. `systems`: measurements of
    systems the runner does not ship, by name (module docstring)."""
    extra = dict(systems or {})
    store = Store(store_path)
    predicted = predicted or {}
    pending = [c for c in configs if not store.done(c.key)]
    total = len(configs)
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(1.0):
            if on_progress is not None:
                on_progress(sum(store.done(c.key) for c in configs), total)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    try:
        for (gpus, device), remaining in _groups(pending).items():
            backend, env = _world_of(device)
            while remaining and (deadline is None or time.time() < deadline):
                try:
                    spawn(
                        _bench_rank,
                        gpus,
                        (
                            remaining,
                            str(store.path),
                            predicted,
                            env,
                            timeout_s,
                            deadline,
                            False,
                            extra,
                        ),
                        backend=backend,
                        timeout_s=timeout_s + 60,
                        grace_s=30,
                    )
                except RankFailed as exc:
                    for cfg in remaining:  # the one in progress when the world died
                        if store.status(cfg.key) == "started":
                            store.put(
                                cfg.key,
                                cfg.suite,
                                "failed",
                                cfg.to_dict(),
                                env,
                                None,
                                predicted.get(cfg.key),
                                str(exc).splitlines()[0][:300],
                            )
                            break
                remaining = [c for c in remaining if not store.done(c.key)]
        for r in range(2, rounds + 1):
            for (gpus, device), group in _groups(configs).items():
                due = [c for c in group if _rounds_done(store, c.key) == r - 1]
                if not due or (deadline is not None and time.time() >= deadline):
                    continue
                backend, env = _world_of(device)
                try:
                    spawn(
                        _bench_rank,
                        gpus,
                        (due, str(store.path), predicted, env, timeout_s, deadline, True, extra),
                        backend=backend,
                        timeout_s=timeout_s + 60,
                        grace_s=30,
                    )
                except RankFailed as exc:  # the rounds already measured stand
                    print(f"[round {r} stopped] {str(exc).splitlines()[0][:200]}", flush=True)
    finally:
        stop.set()
        if on_progress is not None:
            on_progress(sum(store.done(c.key) for c in configs), total)
    return store
