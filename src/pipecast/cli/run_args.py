"""The arguments of `pipecast train` and `pipecast infer`, a group at a time.

Every number is range-checked and every path tried as the arguments are read, so that a bad
one stops the run before the quick profile or any rank starts.
"""

from __future__ import annotations

import argparse

from pipecast.cli.common import (
    AUTOCAST_HELP,
    DTYPE_HELP,
    MICRO_BATCHES_HELP,
    OPTIMIZER_HELP,
    RECOMPUTE_HELP,
    SHARD_OPTIMIZER_HELP,
    add_virtual_arg,
    add_workload_args,
    count_arg,
    number_arg,
    output_dir,
    schedule_arg,
)
from pipecast.planning.schedules.generators import SCHEDULES
from pipecast.runtime import float8
from pipecast.values.training import COMPILE_MODES, LR_SCHEDULES, OFFLOADS, RECOMPUTES

BATCH, MICRO_BATCHES, GPUS = 64, 8, 2
"""--batch's, --micro-batches' and --gpus' defaults (infer --mode latency: one request, 1
and 1)."""


def add_run_args(p: argparse.ArgumentParser, *, inference: bool) -> None:
    add_workload_args(p, required=False, model_note=" (required, unless --recommendation)")
    _add_recommendation_args(p)
    _add_layout_args(p, inference=inference)
    _add_optimizer_args(p, inference=inference)
    _add_memory_args(p, inference=inference)
    if inference:
        _add_inference_args(p)
    p.add_argument(
        "--timeout",
        type=number_arg("--timeout", above=True),
        default=300.0,
        help="seconds any wait may take",
    )
    p.add_argument("--out-dir", type=output_dir, default="pipecast-out", help="where traces go")
    p.add_argument(
        "--kernel-trace",
        action="store_true",
        help="also trace the step before the last under torch.profiler (rank 0): its chrome "
        "trace (.kernels.trace.json.gz) and a summary of kernels, copies and host threads "
        "(.kernels.json) beside the run's trace",
    )
    if not inference:
        _add_data_and_checkpoint_args(p)


def _add_recommendation_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--recommendation",
        metavar="FILE",
        help="run what `pipecast recommend` wrote here: its workload, batch, precision, "
        "optimizer, GPUs, schedule, micro-batches and partition (the measured fastest "
        "where it validated, else the predicted fastest)",
    )
    p.add_argument(
        "--pick",
        type=count_arg("--pick", 0),
        help="with --recommendation: the N-th of its ranking (default: 0, its pick)",
    )


def _add_layout_args(p: argparse.ArgumentParser, *, inference: bool) -> None:
    """Where the model runs and how it is cut: ranks, replicas, schedule, batches, steps."""
    p.add_argument(  # unset until read, so that one given beside --recommendation shows
        "--gpus",
        type=count_arg("--gpus", 1),
        help=f"processes: GPUs, or CPU ranks (default: {GPUS})",
    )
    p.add_argument(
        "--replicas",
        type=count_arg("--replicas", 1),
        default=1,
        help="data-parallel pipeline replicas",
    )
    p.add_argument(
        "--shard",
        choices=("none", "full", "grad"),
        default="none",
        help="the replicas shard the weights with torch's FSDP: full (gathered for the forward "
        "and again for the backward) or grad (kept gathered in between); none: whole copies",
    )
    if not inference:  # a forward-only run steps no optimizer
        p.add_argument("--shard-optimizer", action="store_true", help=SHARD_OPTIMIZER_HELP)
    p.add_argument(
        "--tensor-parallel",
        type=count_arg("--tensor-parallel", 1),
        default=1,
        help="split each pipeline rank's transformer blocks over this many GPUs (Megatron's "
        "column/row plan, torch's parallelize_module); GPUs = replicas x stages x this",
    )
    if not inference:
        p.add_argument(
            "--context-parallel",
            type=count_arg("--context-parallel", 1),
            default=1,
            help="split each sequence over this many GPUs (the zoo's gpt; Llama 3's "
            "all-gather of keys and values); GPUs = replicas x stages x this x tensor-parallel",
        )
        p.add_argument("--schedule", type=schedule_arg, default="1f1b", help=", ".join(SCHEDULES))
        add_virtual_arg(p)
    # infer leaves them unset, so that --mode latency can tell one given from none
    p.add_argument(
        "--micro-batches",
        type=count_arg("--micro-batches", 1),
        default=None,
        help=MICRO_BATCHES_HELP
        + (
            f" (default: {MICRO_BATCHES}; --mode latency: 1)"
            if inference
            else f" (default: 1 where each replica is one stage, else {MICRO_BATCHES})"
        ),
    )
    p.add_argument(
        "--batch",
        type=count_arg("--batch", 1),
        default=None if inference else BATCH,
        help="global batch per step"
        + (f" (default: {BATCH}; --mode latency: 1)" if inference else ""),
    )
    p.add_argument(
        "--partition",
        default="auto",
        help="auto (quick profile + balanced), a method, or boundaries 0,4,10,40",
    )
    p.add_argument("--steps", type=count_arg("--steps", 1), default=10, help="timed steps")
    p.add_argument(
        "--warmup-steps",
        type=count_arg("--warmup-steps", 0),
        default=2,
        help="untimed steps before the timed ones",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="default: cuda where torch finds GPUs, else cpu",
    )


def _add_optimizer_args(p: argparse.ArgumentParser, *, inference: bool) -> None:
    """Precision, the optimizer and its learning rate (training's schedule, scaling,
    clipping)."""
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32", help=DTYPE_HELP)
    p.add_argument("--autocast", action="store_true", help=AUTOCAST_HELP)
    if inference:  # a forward-only run steps no optimizer
        p.set_defaults(optimizer="sgd", lr=0.01)
        return
    p.add_argument(
        "--optimizer", choices=("sgd", "momentum", "adam"), default="sgd", help=OPTIMIZER_HELP
    )
    p.add_argument("--lr", type=number_arg("--lr"), default=0.01, help="learning rate")
    p.add_argument(
        "--lr-schedule",
        choices=LR_SCHEDULES,
        default="constant",
        help="after the warm-up, keep the rate or bring it to --lr-min at the last step",
    )
    p.add_argument(
        "--lr-warmup",
        type=count_arg("--lr-warmup", 0),
        default=0,
        help="steps over which the rate rises to --lr",
    )
    p.add_argument(
        "--lr-min",
        type=number_arg("--lr-min"),
        default=0.0,
        help="the rate a linear or cosine --lr-schedule ends at",
    )
    p.add_argument(
        "--loss-scale",
        type=number_arg("--loss-scale"),
        default=None,
        help="dynamic loss scaling from this scale (default: 65536 for fp16, off otherwise; "
        "0: off)",
    )
    p.add_argument(
        "--clip-grad-norm",
        type=number_arg("--clip-grad-norm"),
        default=0.0,
        help="scale the gradients to this global L2 norm over all stages when above it",
    )


def _add_memory_args(p: argparse.ArgumentParser, *, inference: bool) -> None:
    """Recomputation, host offload and CUDA graphs."""
    if inference:  # a forward-only run keeps nothing for a backward to recompute
        p.set_defaults(recompute="none")
    else:
        p.add_argument(
            "--recompute",
            choices=RECOMPUTES,
            default="none",
            help=RECOMPUTE_HELP,
        )
        p.add_argument(
            "--offload",
            choices=OFFLOADS,
            default="none",
            help="activations: keep what the forward saves for the backward in pinned host "
            "memory (eager: no CUDA graphs); optimizer: step the optimizer on the host, its "
            "state there; both; weights: the optimizer and the weights on the host, streamed "
            "in a block at a time (eager, no recomputation); all: weights and activations",
        )
    if not inference:
        p.add_argument(
            "--weight-batch",
            type=count_arg("--weight-batch", 1),
            default=1,
            help="zb-h1, zb-v, zb-auto: compute the weight gradients of this many "
            "micro-batches as one (one larger matrix product per weight)",
        )
    p.add_argument(
        "--compile",
        choices=COMPILE_MODES,
        default="off",
        help="run the stages as inductor-compiled code: each block with weights its own "
        "graph (blocks), or each stage as one (stage); split backwards compile the input "
        "and weight gradients apart; compiled code is cached (TORCHINDUCTOR_CACHE_DIR, "
        "default ~/.cache/pipecast/inductor)",
    )
    p.add_argument(
        "--compile-budget",
        type=number_arg("--compile-budget", above=True),
        default=1.0,
        help="with --compile: the share (at most 1) of what the compiled forward would save "
        "for the backward that it may keep; below 1 it recomputes normalisations and "
        "activations in the backward instead",
    )
    if not inference:
        p.add_argument(
            "--float8",
            action="store_true",
            help="train each Linear's matrix products in Float8 through torchao "
            f"({float8.INSTALL}); GPUs of compute capability 8.9 or newer (H100, H200)",
        )
    p.add_argument(
        "--channels-last",
        action="store_true",
        help="convolutions in channels-last memory order (NHWC), which GPUs' tensor cores "
        "read without a transpose",
    )
    p.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="replay every action as a CUDA graph after the first step, which captures them "
        "(default: on GPUs, for every schedule but pipedream; --no-cuda-graphs: eager)",
    )


def _add_inference_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mode",
        choices=("throughput", "latency"),
        default="throughput",
        help="latency: one request (batch 1, one micro-batch) through the pipeline",
    )
    p.add_argument(
        "--compare",
        choices=("onnxruntime", "deepspeed"),
        action="append",
        default=[],
        help="also run the model, with the pipeline's weights, in ONNX Runtime or "
        "DeepSpeed's inference engine (repeatable) on the last step's inputs: speed and "
        "the output difference",
    )


def _add_data_and_checkpoint_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data-dir",
        help="train on real samples: MNIST IDX files or CIFAR-10 python batches here "
        "(--dataset mnist or cifar10); default: synthetic batches (real for digits)",
    )
    c = p.add_argument_group("checkpoints")
    c.add_argument(
        "--checkpoint-dir",
        type=output_dir,
        help="write the model's and optimizer's state here after the last step (and "
        "every --checkpoint-every steps); under torchrun, a file system every node shares",
    )
    c.add_argument(
        "--checkpoint-every",
        type=count_arg("--checkpoint-every", 0),
        default=0,
        help="steps between checkpoints",
    )
    c.add_argument(
        "--keep", type=count_arg("--keep", 1), default=2, help="complete checkpoints kept"
    )
    c.add_argument(
        "--resume",
        action="store_true",
        help="start from the newest complete checkpoint in --checkpoint-dir (on any "
        "partition, schedule or GPU count); --steps counts from the start of training",
    )
