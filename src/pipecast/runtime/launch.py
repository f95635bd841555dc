"""Start one process per device and run a function in each, under torch.distributed.

`spawn` starts `world` local processes (CPU + gloo, or one per GPU + NCCL); under torchrun
(RANK/WORLD_SIZE/LOCAL_RANK set) `run_distributed` joins the existing group instead, so the
same function runs across nodes. Each rank's return value comes back through a file, so a
rank that dies never loses what the others finished; a rank that fails leaves its reason and
where it was (outcome.Position). A run that loses a rank (one died, or made no progress
within the timeout) raises RankLost, whose exit code (3) tells it apart from bad input (2).
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import multiprocessing
import os
import pickle
import socket
import tempfile
import time
import traceback
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import start_processes

from pipecast.errors import ConfigError, DeviceError, PipecastError, RuntimeTimeout
from pipecast.runtime import devices, stopping, watchdog
from pipecast.runtime.env_defaults import default_env
from pipecast.runtime.outcome import REPORT_ENV, Position, write_report
from pipecast.runtime.peer_loss import how_lost
from pipecast.runtime.watchdog import EXIT_LOST

Backend = Literal["gloo", "nccl"]


@dataclass(frozen=True, slots=True)
class Context:
    """Where this rank runs."""

    rank: int
    world: int
    local_rank: int
    backend: Backend
    device: torch.device


def all_gather_floats(values: list[float], device: torch.device) -> list[list[float]]:
    """Every rank's `values` (the same length on every rank), one row per rank; just this
    rank's outside a process group of several."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [list(values)]
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return [[float(v) for v in t.tolist()] for t in out]


PROGRESS_ENV = "PIPECAST_PROGRESS"


def write_progress(value: Any) -> None:
    """Tell the launcher how far the run has got (read by `spawn`'s `progress`; nothing
    happens outside spawn, under torchrun for one)."""
    target = os.environ.get(PROGRESS_ENV)
    if target:
        out = Path(target)
        tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(value))
        tmp.replace(out)


def _read_progress(path: Path, progress: Callable[[Any], None], seen: int) -> int:
    """Hand the newest progress written to `path` since `seen` (its mtime) to `progress`."""
    try:
        mtime = path.stat().st_mtime_ns
        if mtime == seen:
            return seen
        value = pickle.loads(path.read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError, ValueError):
        return seen
    progress(value)
    return mtime


class RankFailed(PipecastError):
    """A rank ended with an error; the message carries that rank's own one-line reason."""


class RankLost(RankFailed):
    """A rank died or made no progress within the timeout: the message says what each
    failing rank reported, `where` where each was (by global rank)."""

    exit_code = EXIT_LOST

    def __init__(self, message: str, where: dict[int, Position] | None = None) -> None:
        super().__init__(message)
        self.where = where or {}


def lost_contact(exc: BaseException) -> bool:
    """Whether `exc` says that another rank is gone rather than that the input is wrong: a
    timeout, or an error raised by (or while handling one from) torch.distributed's
    backends: NCCL's DistBackendError, gloo's transport errors ("Connection closed by
    peer"), which are plain RuntimeErrors."""
    for e in (exc, exc.__cause__, exc.__context__):
        if isinstance(e, (RuntimeTimeout, dist.DistError)):
            return True
        if isinstance(e, RuntimeError) and "gloo/transport" in str(e):
            return True
    return False


def lost_reason(exc: BaseException) -> str:
    """One line for an error that says another rank is gone (`lost_contact`): pipecast's own
    message, or for a backend's error (gloo's, raised straight from a collective) that
    contact was lost, while doing what (as the watchdog last saw it) and how, in
    pipecast's words (peer_loss)."""
    if isinstance(exc, PipecastError):
        return (str(exc).splitlines() or [type(exc).__name__])[0]
    at = watchdog.position()
    doing = f" while {at.what}" if at is not None else ""
    return f"lost contact with another rank{doing}: {how_lost(exc)}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _device_for(backend: Backend, local_rank: int, world: int) -> torch.device:
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        devices.pin_host(device, local_world)  # before NCCL starts its threads: they inherit it
        return device
    return torch.device("cpu")


@contextlib.contextmanager
def process_group(
    rank: int,
    world: int,
    local_rank: int,
    backend: Backend,
    timeout_s: float,
    init_method: str = "env://",
) -> Iterator[Context]:
    """Join the process group for the duration of the block; tear it down after."""
    default_env()
    device = _device_for(backend, local_rank, world)
    kwargs: dict[str, Any] = {}
    if backend == "nccl":
        kwargs["device_id"] = device
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
        **kwargs,
    )
    try:
        yield Context(rank, world, local_rank, backend, device)
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


PRELOAD = [
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "torch.distributed.fsdp",
    "torch.distributed.tensor.parallel",
    "pipecast.runtime.worker",
]
"""What the fork server imports once, so that a rank forked from it starts in a fraction of
a second instead of importing torch afresh (seconds a world, paid again by every validation
round, bench configuration and test; docs/decisions.md, "Starting the ranks"). torch._dynamo
too: the first optimizer a rank builds imports it (torch.optim wraps its methods in
torch._disable_dynamo), with sympy, about as long again as torch itself, and preloaded it
leaves a rank almost nothing of its own to import. Variables those
modules read as they are imported (TORCH_LOGS, say) are the fork server's. torch's FSDP
and tensor parallelism (with DTensor) too, which every rank of a mesh imports.
GPU ranks are spawned instead (start_method)."""


START_ENV = "PIPECAST_START_METHOD"
"""'spawn' starts every rank as a fresh interpreter, as before the fork server (slower; for
an environment where forking a process that imported torch misbehaves)."""


def start_method(backend: Backend) -> str:
    """CPU ranks: the fork server where the platform has one (preloading PRELOAD). GPU ranks:
    spawn, a fresh interpreter each: a process forked from one that has touched CUDA (the
    preloaded imports ask torch.cuda whether a device is there) cannot initialise it
    ('CUDA error: initialization error' at set_device; docs/decisions.md, "Starting the
    ranks"), and there a rank's CUDA and NCCL start outweighs the import anyway."""
    if (
        backend == "nccl"
        or os.environ.get(START_ENV) == "spawn"
        or "forkserver" not in multiprocessing.get_all_start_methods()
    ):
        return "spawn"
    multiprocessing.set_forkserver_preload(PRELOAD)  # read when the server starts
    return "forkserver"


def _worker(
    local_rank: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    world: int,
    backend: Backend,
    port: int,
    timeout_s: float,
    outdir: str,
    env: dict[str, str],
    launcher: int,
) -> None:
    stopping.end_with_launcher(launcher, leftovers=outdir)  # first: it may be gone already
    # what the rank holds before its first job (torch and the modules it imported, the
    # arguments) lives as long as the rank: frozen out of the collector, each collection
    # between jobs (runtime.worker.release_earlier_jobs) walks only what the jobs made
    gc.freeze()
    # a rank forked from the server holds the server's environment, from when it started:
    # take the launcher's as it is now
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    out = Path(outdir) / f"rank{local_rank}.pkl"
    os.environ[REPORT_ENV] = str(out)  # the watchdog leaves its report here if it fires
    os.environ[PROGRESS_ENV] = str(Path(outdir) / "progress.pkl")
    try:
        with process_group(local_rank, world, local_rank, backend, timeout_s) as ctx:
            result = fn(ctx, *args)
        payload: tuple[str, Any] = ("ok", result)
    except PipecastError as exc:
        payload = ("lost" if lost_contact(exc) else "error", f"rank {local_rank}: {exc}")
    except BaseException as exc:
        if lost_contact(exc):
            payload = ("lost", f"rank {local_rank}: {lost_reason(exc)}")
        else:
            trace = traceback.format_exc()
            payload = ("crash", f"rank {local_rank}: {type(exc).__name__}: {exc}\n{trace}")
    write_report(*payload, path=str(out), where=watchdog.position())
    if payload[0] != "ok":
        raise SystemExit(1)


def spawn(
    fn: Callable[..., Any],
    world: int,
    args: tuple[Any, ...] = (),
    *,
    backend: Backend = "gloo",
    timeout_s: float = 300.0,
    grace_s: float | None = None,
    progress: Callable[[Any], None] | None = None,
) -> list[Any]:
    """Run fn(context, *args) in `world` new processes; return each rank's result.
    `timeout_s` bounds collective waits; once a rank dies, the others get `grace_s` (default
    `timeout_s`) to report before they are killed. `progress` receives, in this process,
    what a rank passes to `write_progress` (the newest value, as the ranks go).

    `fn` and `args` must be picklable (a module-level function). Raises RankFailed with the
    first failing rank's reason."""
    if world < 1:
        raise ConfigError(f"world size must be at least 1, got {world}")
    if backend == "nccl":
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < world:
            raise DeviceError(
                f"{world} GPUs requested but this machine has {have}: "
                "use fewer --gpus or --device cpu"
            )
    default_env()
    with tempfile.TemporaryDirectory(prefix="pipecast-") as outdir:
        port, env = free_port(), dict(os.environ)
        context = None
        try:
            with stopping.held():  # a signal now would leave the ranks started so far running
                context = start_processes(  # type: ignore[no-untyped-call]
                    _worker,
                    args=(fn, args, world, backend, port, timeout_s, outdir, env, os.getpid()),
                    nprocs=world,
                    join=False,
                    start_method=start_method(backend),
                )
            grace = timeout_s if grace_s is None else grace_s
            ended = _wait_all(
                context.processes,
                grace_s=grace,
                watch=(Path(outdir) / "progress.pkl", progress) if progress else None,
            )
            return _results(outdir, context.processes, ended, grace)
        finally:  # done, or stopped (a signal, Ctrl-C): no rank outlives the launch
            if context is not None:
                with stopping.held():
                    _end(context.processes)


def _end(processes: list[Any]) -> None:
    """Kill the ranks still running and reap them: a child left behind would keep
    training, and multiprocessing would wait for it as the launcher exits."""
    for proc in processes:
        if proc.is_alive():
            proc.kill()
    for proc in processes:
        proc.join(timeout=5)


def _results(
    outdir: str, processes: list[Any], ended: Collection[int] = (), grace_s: float = 0.0
) -> list[Any]:
    """Each rank's result. A rank that died, hung (its watchdog ended it, or the launcher
    did: `ended`, after `grace_s`) or lost contact with another, and none that failed on its
    own: RankLost, with every failing rank's reason (a survivor's first) and where each was.
    Otherwise the first failure's reason as RankFailed (a rank's own error before a crash,
    before the others losing contact)."""
    results: list[Any] = [None] * len(processes)
    failures: list[tuple[str, str]] = []
    where: dict[int, Position] = {}
    for rank, proc in enumerate(processes):
        path = Path(outdir) / f"rank{rank}.pkl"
        if not path.exists() and rank in ended:
            failures.append(("hung", _unresponsive(rank, grace_s)))
            continue
        if not path.exists():
            code = proc.exitcode
            failures.append(("died", f"rank {rank} died (exit code {code}) before reporting"))
            continue
        status, value, at = pickle.loads(path.read_bytes())
        if status == "ok":
            results[rank] = value
            continue
        failures.append(("hung" if proc.exitcode == EXIT_LOST else status, value))
        if at is not None:
            where[rank] = at
    if not failures:
        return results
    kinds = {status for status, _ in failures}
    if kinds & {"died", "hung"} or not kinds & {"error", "crash"}:
        order = {"error": 0, "lost": 0, "hung": 0, "crash": 1, "died": 2}
        ranked = [text for _, text in sorted(failures, key=lambda f: order[f[0]])]
        lines = [ranked[0], *(text.splitlines()[0] for text in ranked[1:])]
        raise RankLost("\n".join(lines), where)
    order = {"error": 0, "crash": 1, "lost": 2}
    raise RankFailed(sorted(failures, key=lambda f: order[f[0]])[0][1])


def _unresponsive(rank: int, grace_s: float) -> str:
    """What to say of a rank the launcher killed because it neither finished nor reported
    within `grace_s` of another rank failing: it hung (stopped, say), not died; its own
    watchdog could not run either, or it would have reported."""
    return (
        f"rank {rank} hung: it made no progress within the timeout and did not report in "
        f"the {grace_s:.0f} s after another rank failed (stopped, or stuck where its own "
        "watchdog could not run); pipecast ended it"
    )


def _wait_all(
    processes: list[Any],
    grace_s: float,
    watch: tuple[Path, Callable[[Any], None]] | None = None,
) -> set[int]:
    """Wait for every rank. When one dies, the others get `grace_s` to notice and report
    (their watchdogs fire within their timeout) before they are killed; the ranks killed
    so (stopped, or hung where not even their watchdog ran). `watch`: a progress file and
    what to hand its news to."""
    first_death: float | None = None
    seen = 0
    ended: set[int] = set()
    while any(p.is_alive() for p in processes):
        if watch is not None:
            seen = _read_progress(*watch, seen)
        if first_death is None and any(not p.is_alive() and p.exitcode for p in processes):
            first_death = time.monotonic()
        if first_death is not None and time.monotonic() - first_death > grace_s:
            for rank, p in enumerate(processes):
                if p.is_alive():
                    p.kill()
                    ended.add(rank)
            break
        time.sleep(0.05)
    for p in processes:
        p.join(timeout=5)
    if watch is not None:
        _read_progress(*watch, seen)
    return ended


def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"))


def run_distributed(
    fn: Callable[..., Any],
    args: tuple[Any, ...] = (),
    *,
    backend: Backend = "gloo",
    timeout_s: float = 300.0,
) -> Any:
    """Under torchrun: run fn(context, *args) in this process's rank and return its result."""
    if not under_torchrun():
        raise ConfigError(
            "run_distributed needs torchrun's RANK, WORLD_SIZE, LOCAL_RANK and "
            "MASTER_ADDR; without torchrun use spawn()"
        )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    with process_group(rank, world, local, backend, timeout_s) as ctx:
        try:
            return fn(ctx, *args)
        except Exception as exc:
            if not lost_contact(exc):
                raise
            at = watchdog.position()
            raise RankLost(f"rank {rank}: {lost_reason(exc)}", {rank: at} if at else {}) from None
