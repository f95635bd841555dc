"""Models too big for the work asked of them, refused before it starts.

Profiling builds the whole model in this machine's memory (fp32, as built) and runs each
block on the device it profiles on; a model whose parameters alone exceed the host's
memory, or whose largest block exceeds the GPU's, cannot be profiled here and would
otherwise grow until something kills it. And a block is the unit a stage holds: even a
shapes-only build of more than MAX_BLOCKS takes minutes and gigabytes.
"""

from __future__ import annotations

import torch

from pipecast.errors import ConfigError
from pipecast.runtime import devices
from pipecast.values.hardware.units import human_bytes
from pipecast.values.models.size import EXACT_LAYERS, ModelSize, model_size
from pipecast.values.models.sources import is_source_path
from pipecast.values.models.workload import Workload

MAX_BLOCKS = 4096
"""The most blocks a model may have: a pipeline stage holds whole blocks, and the models
pipeline training is for have tens to hundreds."""

FIX = "use fewer --layers or a smaller --width"


def check_model_size(workload: Workload, *, device: str | None = None) -> None:
    """A one-line ConfigError where `workload` is too big: for building at all (its blocks),
    and, where `device` names where it will be profiled, for this machine's memory (its
    parameters) and that GPU's (its largest block). A model from a factory at a small
    layer count is left to its own build, which exporting it makes slow to repeat."""
    if is_source_path(workload.model) and workload.layers <= EXACT_LAYERS:
        return
    size = model_size(workload)
    name = _named(workload, size)
    if device is not None:
        host = devices.total_memory(torch.device("cpu"))
        if host and size.bytes > host:
            raise ConfigError(
                f"{name} takes {human_bytes(size.bytes)} as built (fp32), more than this "
                f"machine's {human_bytes(host)} of memory, which holds the whole model to "
                f"profile it: {FIX}"
            )
        gpu = _gpu_memory(device)
        if gpu and size.largest_block > gpu:
            raise ConfigError(
                f"{name} has a block of {human_bytes(size.largest_block)} (fp32), more than "
                f"the {human_bytes(gpu)} of the GPU it is profiled on: {FIX}"
            )
    if size.blocks > MAX_BLOCKS:
        raise ConfigError(
            f"{name} has {size.blocks:,} blocks, more than the {MAX_BLOCKS:,} pipecast builds "
            "(a stage holds whole blocks): use fewer --layers"
        )


def _named(workload: Workload, size: ModelSize) -> str:
    layers = f" with {workload.layers:,} layers" if workload.layers else ""
    return f"{workload.model}{layers} ({size.params:,} parameters)"


def _gpu_memory(device: str) -> int:
    """The memory of the GPU `device` names, where it is one and is here; else 0."""
    if device == "auto":
        device = "cuda"
    try:
        dev = torch.device(device)
    except RuntimeError:
        return 0  # the verb names a bad device itself
    if dev.type != "cuda" or not torch.cuda.is_available():
        return 0
    if (dev.index or 0) >= torch.cuda.device_count():
        return 0
    return devices.total_memory(torch.device("cuda", dev.index or 0))
