"""What the profiler measures and how hard it tries."""

from __future__ import annotations

from dataclasses import dataclass

from pipecast.values.profile.types import Dtype
from pipecast.values.training import Compile


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileOptions:
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    """Micro-batch sizes to measure; costs at other sizes are interpolated."""
    device: str = "cpu"
    dtype: Dtype = "fp32"
    """Parameter and activation dtype; with `autocast`, parameters stay fp32."""
    autocast: bool = False
    warmup: int = 2
    repeats: int = 7
    offload: bool | None = None
    """Hold one block on the device at a time (None: only when the model does not fit)."""
    in_situ: bool = True
    """Time blocks in context too: forward between events in one whole-model pass, and the
    whole backward shared out by each block's isolated share. Isolated timing alone charges
    every block a fresh autograd call; a stage backs all its blocks up in one."""
    host_windows: int = 3
    """Windows of plain whole-model passes (`in_situ`) per size, spread over the profile:
    one before the per-block runs, one at the size's turn, the rest after them; each
    reading is the median over windows (context.across_windows). One window, a second or
    two, sees one of the host's spells, which on shared GPU hosts move host times by tens
    of per cent (docs/decisions.md, "Windows of host readings"). GPUs only: on a CPU, whose
    host costs are not modelled, one window."""
    hide_issue: bool = True
    """Time the in-context passes' devices with the host's issuing hidden (CUDA only): more
    passes, each behind a spinning kernel long enough for the host to issue all of it first,
    so that their events time the device alone; host times still come from plain passes.
    Without it a host-bound block's device time reads as the time its host took to issue
    it, while in a pipeline a rank whose host runs ahead of its data runs that block at the
    device's speed (docs/decisions.md, "Device times with the issuing hidden")."""
    graph_times: bool = True
    """Also time every block's forward and whole backward replayed as CUDA graphs (CUDA
    only, without autocast), for predictions of graphed runs (RunConfig.cuda_graphs):
    each block captured alone, then the whole model as one graph to share out."""
    compile: Compile = "off"
    """Profile the blocks as inductor-compiled code ('blocks': each block its own graph, its
    backward split for B and W as a zero-bubble stage runs it; pipecast.runtime.compiled).
    Every micro-batch size compiles its own graphs; the first pass at each size is timed
    as Profile.compile_seconds."""
    compile_budget: float = 1.0
    """RunConfig.compile_budget for the compiled blocks."""
    channels_last: bool = False
    """Convolutions in channels-last memory order (RunConfig.channels_last)."""
    float8: bool = False
    """Linears in Float8 (RunConfig.float8)."""
    seed: int = 0
    tensor_parallel: tuple[int, ...] = ()
    """Tensor-parallel degrees to also profile the model at: each block with a plan
    (values/models/tensor_plans.py) timed at the shapes one rank of that many computes
    (Profile.tensor_parallel)."""
