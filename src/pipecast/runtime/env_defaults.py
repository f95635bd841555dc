"""The environment pipecast's processes run with, where the user set none of it: variables
read before torch starts CUDA, NCCL or the caching allocator, so each process sets them first
(the CLI's before its command, each rank's before it joins its group). No torch import:
the CLI sets them before anything imports torch."""

from __future__ import annotations

import os

# NVLink multicast (NVLS) can take shared GPU hosts out of service; pipecast never needs it.
_SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

QUIET_ENV = {"TORCH_NCCL_SHOW_EAGER_INIT_P2P_SERIALIZATION_WARNING": "0"}
"""Warnings a rank need not print. NCCL warns, once per process group and rank, that eager
sends and receives are serialized with every other op of their group, and advises a group of
their own; every directed pair of stages already has one (runtime.channels), so that order is
the one the plan asked for, and the warning only buried `recommend --validate`'s output
under lines from every rank (docs/decisions.md, "NCCL's serialization warning")."""


ALLOCATOR_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
"""Where torch reads its caching allocator's settings (the second is the newer name)."""
ALLOCATOR = "expandable_segments:True"
"""The caching allocator's setting pipecast runs with where the user set none: segments that
grow a page at a time instead of new fixed-size ones, so what the allocator reserves stays
near what is allocated, which is what the memory model predicts, at no cost in step time
(docs/decisions.md, "What the allocator reserves"). torchtitan sets the same."""


def default_env() -> None:
    """_SAFE_ENV, QUIET_ENV and ALLOCATOR, where the user has not set the variable. Called
    before CUDA starts in every process pipecast runs on GPUs (the CLI's, each rank's)."""
    for key, value in (_SAFE_ENV | QUIET_ENV).items():
        os.environ.setdefault(key, value)
    if not any(key in os.environ for key in ALLOCATOR_ENV):
        os.environ[ALLOCATOR_ENV[0]] = ALLOCATOR
