"""What `pipecast train` and `infer` check before anything starts: each a one-line error
naming the rule, the values and the fix (the GPUs and host memory a plan needs, the ranks
this machine can start, options that would be dropped without a word)."""

from __future__ import annotations

import argparse

import torch

from pipecast.cli.console import human_bytes
from pipecast.errors import ConfigError, DeviceError
from pipecast.extras import check_installed
from pipecast.orchestration.recommend.session import MAX_CPU_RANKS


def check_fits(need: int, free: list[int] | None, gpus: int) -> None:
    """A one-line ConfigError where the plan's predicted peak per GPU (`need`, bytes; 0:
    unknown) exceeds what the first `gpus` GPUs have free (`free`; None: unknown), before
    anything starts: a run that would fail out of memory after its set-up, or its first
    steps, says so now."""
    if not need or not free:
        return
    short = [(i, f) for i, f in enumerate(free[:gpus]) if f < need]
    if short:
        i, f = short[0]
        raise ConfigError(
            f"the plan needs {human_bytes(need)} per GPU (predicted), GPU {i} has "
            f"{human_bytes(f)} free: use more GPUs or micro-batches, recomputation, or "
            "`pipecast recommend --memory-limit` to plan for what is free"
        )


def check_host_fits(need: int, free: int | None) -> None:
    """A one-line ConfigError where the plan's predicted pinned host memory (`need`, bytes;
    0: none or unknown) exceeds what the host has free (`free`; None: unknown), before
    anything starts: pinning more than is free fails, or swaps the rest out."""
    if need and free is not None and need > free:
        raise ConfigError(
            f"the plan needs {human_bytes(need)} of host memory (predicted: what it keeps "
            f"on the host, every rank's), the host has {human_bytes(free)} free: offload "
            "less (--offload), use more GPUs, or free host memory"
        )


def check_shard(shard: str, replicas: int) -> None:
    """FSDP shards over the data-parallel replicas: with one there is nothing to shard over,
    and the run would quietly be a plain pipeline."""
    if shard != "none" and replicas < 2:
        raise ConfigError(
            f"--shard {shard} shards the weights over data-parallel replicas, and there is "
            f"{replicas}: add --replicas N (N of at least 2 dividing --gpus)"
        )


def check_shard_optimizer(args: argparse.Namespace) -> None:
    """--shard-optimizer splits the state over replicas that hold whole copies: with one
    replica, beside FSDP or tensor parallelism it would be dropped or fail in the ranks."""
    if not getattr(args, "shard_optimizer", False):
        return
    if args.replicas < 2:
        raise ConfigError(
            "--shard-optimizer shards the optimizer's state over data-parallel replicas, and "
            f"there is {args.replicas}: add --replicas N (N of at least 2 dividing --gpus)"
        )
    if args.shard != "none":
        raise ConfigError(
            f"--shard-optimizer beside --shard {args.shard}: FSDP shards the optimizer's "
            "state with the weights already: drop one of them"
        )
    if args.tensor_parallel > 1:
        raise ConfigError(
            f"--shard-optimizer does not run with --tensor-parallel {args.tensor_parallel}: "
            "drop one of them"
        )


def check_ranks(ranks: int, device: str, recommendation: str | None = None) -> None:
    """As many GPUs as asked for are here, or few enough CPU ranks to start (each a
    process), checked before the quick profile rather than at the launch. The fix named is
    one that works: for a recommendation, which sets both, planning again for this machine."""
    if device == "cuda":
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if ranks > have and recommendation:
            plan_here = "--device cpu" if not have else f"--gpus {have}"
            raise DeviceError(
                f"{recommendation} plans {ranks} GPUs and this machine has {have}: run it "
                f"where there are {ranks}, or plan for this machine with `pipecast recommend "
                f"{plan_here}` and run that"
            )
        if ranks > have:
            fewer = f"--gpus {have} or fewer, or " if have else ""
            raise DeviceError(
                f"{ranks} GPUs requested but this machine has {have}: use {fewer}--device cpu "
                "(CPU ranks)"
            )
    elif ranks > MAX_CPU_RANKS:
        raise ConfigError(
            f"{ranks} CPU ranks is more than pipecast starts on one machine ({MAX_CPU_RANKS}): "
            "use fewer --gpus, or GPUs"
        )


def check_one_request(args: argparse.Namespace) -> None:
    """infer --mode latency runs one request (batch 1 in one micro-batch): a --batch or
    --micro-batches of more beside it is refused rather than dropped (infer leaves both
    unset where they are not given)."""
    if getattr(args, "mode", "") != "latency":
        return
    for flag, value in (("--batch", args.batch), ("--micro-batches", args.micro_batches)):
        if value not in (None, 1):
            raise ConfigError(
                f"--mode latency runs one request (batch 1 in one micro-batch), and {flag} "
                f"{value} asks for more: drop {flag}, or use --mode throughput"
            )


def check_runtimes(runtimes: list[str]) -> None:
    """Before anything runs: every runtime --compare names is installed, and named once."""
    from pipecast.measuring.interop import deepspeed_inference, onnx_runtime

    twice = sorted({name for name in runtimes if runtimes.count(name) > 1})
    if twice:
        raise ConfigError(
            f"--compare {twice[0]} is given {runtimes.count(twice[0])} times: name each "
            "runtime once"
        )
    install = {"onnxruntime": onnx_runtime.INSTALL, "deepspeed": deepspeed_inference.INSTALL}
    for name in runtimes:
        check_installed(name, needed_by=f"--compare {name}", install=install[name])
