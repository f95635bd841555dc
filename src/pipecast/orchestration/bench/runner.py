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
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from pipecast.errors import PipecastError
from pipecast.measuring import hostspeed
from pipecast.orchestration.bench import sharing
from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.store import Store, environment
from pipecast.orchestration.bench.systems import SystemRun, run_config
from pipecast.orchestration.bench.threads import rank_threads
from pipecast.runtime.launch import Backend, Context, RankFailed, all_gather_floats, spawn
from pipecast.runtime.watchdog import Watchdog
from pipecast.runtime.worker import release_earlier_jobs


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
    threads: int | None = None,
) -> None:
    """Measure each configuration once and record it. `again`: each has a record already;
    measure it once more and fold the measurement into that record (one more round).
    `threads`: intra-op threads this rank computes with (None: the launcher's). The
    world first runs its first configuration briefly, unrecorded (`warm_up`)."""
    if threads:
        torch.set_num_threads(threads)
    store = Store(store_path) if ctx.rank == 0 else None
    if configs:
        _measure(ctx, warm_up(configs[0]), timeout_s, systems)
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


def warm_up(cfg: BenchConfig) -> BenchConfig:
    """The run a fresh world makes before its first measured configuration, so that the
    first pays no start-up cost the others do not (the first convolutions, transfers and
    allocations a process makes, and the host's caches): `cfg` for one warm-up and one
    timed step, not trained for accuracy."""
    return replace(cfg, steps=1, warmup=1, accuracy_steps=0)


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
        start = sharing.Mark.now()
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
        end = sharing.Mark.now()
        if ok.item():  # how fast each rank's host ran around its measurement
            wait = sharing.waited_share(start, end)
            readings = [
                speed,
                issued,
                ahead,
                torch.get_num_threads(),
                -1.0 if wait is None else wait,
            ]
            speeds = all_gather_floats(readings, ctx.device)
            measured["threads"] = [int(r[3]) for r in speeds]  # each rank's intra-op threads
            measured["host_reference"] = [r[0] for r in speeds]
            measured["host_issue"] = [r[1] for r in speeds]
            # read before the run started: what a prediction made just then could know
            measured["host_issue_before"] = [r[2] for r in speeds]
            if all(r[4] >= 0 for r in speeds):  # how long each rank waited for a core
                measured["waited"] = [r[4] for r in speeds]  # (bench.sharing)
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
    if "waited" in so_far and "waited" in again:  # each rank's longest wait of the rounds
        out["waited"] = [max(a, b) for a, b in zip(so_far["waited"], again["waited"], strict=True)]
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


def _world_of(device: str, threads: int | None) -> tuple[Backend, dict[str, Any], int | None]:
    """The process-group backend, the environment record and the threads per rank
    (None: the launcher's) for a group on `device`; `threads` is the CPU suite's
    (bench.threads)."""
    if device == "cuda":
        return "nccl", environment("cuda"), None
    return "gloo", environment(device, threads=threads), threads


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
    suite = _Suite(configs, Store(store_path), predicted or {}, timeout_s, deadline, systems)
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(1.0):
            if on_progress is not None:
                on_progress(*suite.progress())

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    try:
        suite.first_round()
        for r in range(2, rounds + 1):
            suite.round_again(r)
    finally:
        stop.set()
        if on_progress is not None:
            on_progress(*suite.progress())
    return suite.store


class _Suite:
    """One run_suite call: its configurations, store and the worlds it spawns."""

    def __init__(
        self,
        configs: list[BenchConfig],
        store: Store,
        predicted: dict[str, dict[str, Any]],
        timeout_s: float,
        deadline: float | None,
        systems: Mapping[str, SystemRun] | None,
    ) -> None:
        self.configs = configs
        self.store = store
        self.predicted = predicted
        self.timeout_s = timeout_s
        self.deadline = deadline
        self.systems = dict(systems or {})
        self.cpu_threads = rank_threads(configs)  # the whole suite's, resumed or not
        self.settings: dict[str, tuple[Backend, dict[str, Any], int | None]] = {}
        """_world_of per device, read once: the environment record reads the machine."""

    def setting(self, device: str) -> tuple[Backend, dict[str, Any], int | None]:
        if device not in self.settings:
            self.settings[device] = _world_of(device, self.cpu_threads)
        return self.settings[device]

    def progress(self) -> tuple[int, int]:
        """(configurations finished, configurations in the suite)."""
        return sum(self.store.done(c.key) for c in self.configs), len(self.configs)

    def in_time(self) -> bool:
        return self.deadline is None or time.time() < self.deadline

    def _world(self, gpus: int, device: str, configs: list[BenchConfig], again: bool) -> None:
        """Spawn one world measuring `configs` (`again`: one more round of each);
        RankFailed when it dies."""
        backend, env, threads = self.setting(device)
        args = (
            configs,
            str(self.store.path),
            self.predicted,
            env,
            self.timeout_s,
            self.deadline,
            again,
            self.systems,
            threads,
        )
        spawn(
            _bench_rank,
            gpus,
            args,
            backend=backend,
            timeout_s=self.timeout_s + 60,
            grace_s=30,
        )

    def first_round(self) -> None:
        """Measure every configuration not finished yet; a world that dies marks the one
        in progress failed and a fresh world goes on with the rest."""
        pending = [c for c in self.configs if not self.store.done(c.key)]
        for (gpus, device), remaining in _groups(pending).items():
            while remaining and self.in_time():
                try:
                    self._world(gpus, device, remaining, again=False)
                except RankFailed as exc:
                    self._fail_started(remaining, device, exc)
                remaining = [c for c in remaining if not self.store.done(c.key)]

    def _fail_started(self, configs: list[BenchConfig], device: str, exc: RankFailed) -> None:
        """Record the configuration in progress when the world died as failed."""
        env = self.setting(device)[1]
        for cfg in configs:
            if self.store.status(cfg.key) == "started":
                error = str(exc).splitlines()[0][:300]
                self.store.put(
                    cfg.key,
                    cfg.suite,
                    "failed",
                    cfg.to_dict(),
                    env,
                    None,
                    self.predicted.get(cfg.key),
                    error,
                )
                return

    def round_again(self, r: int) -> None:
        """Round `r`: measure again each configuration with r - 1 rounds so far."""
        for (gpus, device), group in _groups(self.configs).items():
            due = [c for c in group if _rounds_done(self.store, c.key) == r - 1]
            if not due or not self.in_time():
                continue
            try:
                self._world(gpus, device, due, again=True)
            except RankFailed as exc:  # the rounds already measured stand
                print(f"[round {r} stopped] {str(exc).splitlines()[0][:200]}", flush=True)
