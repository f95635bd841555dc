"""One pipeline stage on one rank: its blocks, its optimizer, and its forward.

A received input is a leaf that requires grad, which an in-place first op (VGG's ReLU
(inplace=True) at a stage boundary) may not modify: torch.distributed.pipelining crashes
there. Such a stage feeds its blocks a copy; the copy costs one boundary-sized memcpy.

For a split backward the stage's forward can run cut into segments (`forward_cut`), each
from a detached leaf of the one before: a cut never feeds a block that starts in place.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from pipecast.errors import ConfigError
from pipecast.runtime import compiled, devices, float8, sharding
from pipecast.runtime import recompute as recomputation
from pipecast.runtime.backward import Cut
from pipecast.runtime.config import RunConfig
from pipecast.runtime.host_step import HostStep
from pipecast.runtime.sharding import StageMesh
from pipecast.runtime.weight_stream import WeightStream
from pipecast.values.profile.segments import segments
from pipecast.values.training import offloads_optimizer, offloads_weights

_INPLACE_ERROR = "leaf Variable that requires grad is being used in an in-place operation"
M = TypeVar("M", bound=nn.Module)


def materialize(module: M, device: torch.device) -> M:
    """Give a meta-device module real, freshly initialised weights on `device`."""
    module = module.to_empty(device=device)
    for sub in module.modules():
        for name in ("reset_parameters", "_reset_parameters"):
            reset = getattr(sub, name, None)
            if callable(reset):
                with torch.no_grad():
                    reset()
                break
    return module


def make_optimizer(params: Any, config: RunConfig, *, host: bool = False) -> torch.optim.Optimizer:
    """The run's optimizer over `params`, fused where its tensors are on a GPU or are the
    offloaded optimizer's host copy (`host`): torch's fused kernels make one pass over each
    tensor where the default makes one per arithmetic step (Adam reads and writes every
    tensor about ten times, fused once: docs/decisions.md, "The optimizer on the host").
    CPU ranks keep torch's default. `params`: a list of parameters, or of parameter groups."""
    grouped = bool(params) and isinstance(params[0], dict)
    flat = [q for g in params for q in g["params"]] if grouped else params
    fused = True if host or any(p.is_cuda for p in flat) else None
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr, fused=fused)
    momentum = 0.9 if config.optimizer == "momentum" else 0.0
    return torch.optim.SGD(params, lr=config.lr, momentum=momentum, fused=fused)


class StageModule:
    def __init__(
        self,
        index: int,
        blocks: nn.Sequential,
        device: torch.device,
        config: RunConfig,
        *,
        first: bool,
        last: bool,
        mesh: StageMesh | None = None,
        split: bool = False,
    ) -> None:
        """`split`: the plan splits this stage's backward into B and W (its compiled code is
        split to match, pipecast.runtime.compiled)."""
        self.index, self.first, self.last = index, first, last
        self.start = 0
        """Global index of the stage's first block."""
        self.device, self.config = device, config
        if not config.autocast and config.dtype != "fp32":
            blocks = blocks.to(devices.DTYPES[config.dtype])
        self.module = blocks.to(device)
        if config.channels_last:
            self.module = self.module.to(memory_format=torch.channels_last)
        if config.float8:
            float8.convert(self.module)
        self.mesh = mesh or StageMesh()
        """How torch's FSDP and tensor parallelism split and shard the blocks
        (pipecast.runtime.sharding); empty: the blocks run whole."""
        sharding.apply(self.module, self.mesh, config.recompute)
        self.block_checkpoints = self.mesh.dp is not None and config.recompute != "none"
        """Each block is a checkpoint of its own, switched on for a forward that recomputes
        (FSDP's stages: pipecast.runtime.recompute); otherwise the stage is one."""
        if config.compile != "off":
            compiled.compile_blocks(
                self.module,
                split=split and not self.meshed,
                whole=config.compile == "stage",
                budget=config.compile_budget,
            )
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.host_params: list[nn.Parameter] | None = None
        """With the optimizer on the host (RunConfig.offload): its copy of the weights, in
        the same order as `params`, which it steps and copies back."""
        self.host_step: HostStep | None = None
        """With the optimizer on the host: its blocks' steps (pipecast.runtime.host_step)."""
        self.optimizer: torch.optim.Optimizer | None = None
        if offloads_optimizer(config.offload) and self.params:
            self.host_params = [nn.Parameter(_pinned_like(p, device)) for p in self.params]
            self.weights_changed()
            self.host_step = HostStep(
                list(self.module),
                self.params,
                self.host_params,
                lambda ps: make_optimizer(ps, config, host=True),
                device,
                streamed=offloads_weights(config.offload),
            )
            self.optimizer = self.host_step.optimizer
        elif self.params:
            self.optimizer = make_optimizer(self.params, config)
        self.streamed: WeightStream | None = None
        """With the weights streamed (RunConfig.offload): the device holds a window of
        blocks' weights, brought in from `host_params` as the blocks run."""
        if offloads_weights(config.offload) and self.host_params is not None:
            self.streamed = WeightStream(list(self.module), self.params, self.host_params, device)
            if device.type == "cuda":  # the whole weights it was built with stay reserved
                torch.cuda.empty_cache()
        self.copy_input = bool(len(blocks)) and needs_input_copy(blocks[0])
        self.parts = (
            [self.module] if self.meshed or config.compile != "off" else _parts(self.module)
        )
        """The stage's segments (pipecast.values.profile.segments), each run as its own autograd
        graph when the backward is split; a single part when there is nothing to cut, or when
        the blocks are compiled (a compiled block's W walks no graph)."""
        self.part_params = [
            [p for p in part.parameters() if p.requires_grad] for part in self.parts
        ]
        self.version = 0
        """Weight updates applied so far (PipeDream's weight version)."""
        self.version_log: list[tuple[int, int]] = []
        """(micro-batch, weight version its forward used), PipeDream only."""

    @property
    def meshed(self) -> bool:
        """Torch's FSDP or tensor parallelism runs the blocks: their weights are DTensors, so
        the split backward takes plain autograd calls (backward.py's split re-enters nodes
        and writes .grad by hand, which FSDP's hooks would not see)."""
        return self.mesh.tp is not None or self.mesh.dp is not None

    def step(self) -> None:
        """The optimizer's step. On the host: the gradients not yet copied out copied out,
        the host's copy of the weights stepped there block by block, and copied back
        (pipecast.runtime.host_step)."""
        if self.optimizer is None:
            return
        if self.host_step is None:
            self.optimizer.step()
            return
        self.host_step.step()
        if self.streamed is not None:  # the next blocks to run bring the new weights in
            self.streamed.host_stepped()

    def grad_of(self, param: nn.Parameter) -> torch.Tensor | None:
        """`param`'s gradient of the last backward: on the host where the gradients left
        the device as they were produced (pipecast.runtime.host_step), else its .grad."""
        if self.host_step is not None and self.host_step.overlap:
            return self.host_step.last_grad(param)
        return param.grad

    def zero_grad(self, *, set_to_none: bool) -> None:
        if self.optimizer is None:
            return
        if self.host_params is None:
            self.optimizer.zero_grad(set_to_none=set_to_none)
            return
        for p in self.params:  # the device's own: each step sets the host's afresh
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def weights_changed(self) -> None:
        """The device's weights are the ones to keep (as built, or as a checkpoint set them
        inside `resident`): the host's copy follows."""
        if self.host_params is not None:
            with torch.no_grad():
                for p, h in zip(self.params, self.host_params, strict=True):
                    h.copy_(p)

    @contextlib.contextmanager
    def resident(self) -> Iterator[None]:
        """Every weight on the device inside this block (to save, load or read them), even
        where they are streamed."""
        if self.streamed is None:
            yield
            return
        self.streamed.bring_all()
        try:
            yield
        finally:
            self.streamed.release_all()

    @contextlib.contextmanager
    def _precision(self) -> Iterator[None]:
        if self.config.autocast and self.config.dtype != "fp32":
            # a graph may not keep autocast's cached weight casts past its capture
            dtype = devices.DTYPES[self.config.dtype]
            cache = self.config.cuda_graphs is False
            with torch.autocast(self.device.type, dtype=dtype, cache_enabled=cache):
                yield
        else:
            yield

    def forward(
        self, x: Any, *, recompute: bool = False, weights: dict[str, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """Run the stage; `weights` replaces the parameters (PipeDream's stashed version)."""
        run: Callable[[Any], torch.Tensor]
        if weights is not None:

            def run(inp: Any) -> torch.Tensor:
                out: torch.Tensor = torch.func.functional_call(self.module, weights, (inp,))
                return out
        else:
            run = self.module
        return self._run(x, [run], recompute)[0]

    def forward_cut(
        self, x: torch.Tensor, *, recompute: bool = False
    ) -> tuple[torch.Tensor, list[Cut]]:
        """Run the stage segment by segment (for a split backward), each segment from a
        detached leaf of the previous one's output; the output and the cuts."""
        return self._run(x, self.parts, recompute)

    def _run(
        self, x: Any, parts: Sequence[Callable[[Any], torch.Tensor]], recompute: bool
    ) -> tuple[torch.Tensor, list[Cut]]:
        """`parts` one after another, each past the first from a detached leaf. An in-place
        op no check could see makes the stage copy its input, and failing that (the op sat
        at a cut) stop cutting."""
        h = x.clone() if self.copy_input and isinstance(x, torch.Tensor) else x
        if self.config.channels_last and isinstance(h, torch.Tensor) and h.dim() == 4:
            h = h.contiguous(memory_format=torch.channels_last)
        cuts: list[Cut] = []
        try:
            with self._precision():
                for i, part in enumerate(parts):
                    if i:
                        leaf = h.detach().requires_grad_(True)
                        cuts.append(Cut(output=h, leaf=leaf))
                        h = leaf
                    h = self._part(part, h, recompute)
        except RuntimeError as exc:
            if _INPLACE_ERROR not in str(exc) or (self.copy_input and len(parts) == 1):
                raise
            if not self.copy_input:  # at the stage's input, perhaps
                self.copy_input = True
                return self._run(x, parts, recompute)
            self.parts = [self.module]
            self.part_params = [self.params]
            return self._run(x, self.parts, recompute)
        out: torch.Tensor = h
        return out, cuts

    def _part(self, part: Callable[[Any], torch.Tensor], h: Any, recompute: bool) -> Any:
        """One part of the stage's forward, recomputed in the backward where `recompute`:
        as one checkpoint; each block its own where FSDP shards the stage or the
        recomputation is selective (pipecast.runtime.recompute); or, with the weights
        streamed, a group of blocks at a time (pipecast.runtime.weight_stream)."""
        if not recompute:
            return part(h)
        if self.block_checkpoints:
            with recomputation.recomputing(self.module, True):
                return part(h)
        by_block = self.config.recompute == "selective" or (self.first and self.last)
        if by_block and self.streamed is None and isinstance(part, nn.Sequential):
            # a whole model recomputed as one checkpoint would hold all its activations
            # again in the backward: each block is a checkpoint of its own
            context = recomputation.context_fn(self.config.recompute)
            for block in part:
                h = checkpoint(block, h, use_reentrant=False, context_fn=context)
            return h
        if self.streamed is None:
            context = recomputation.context_fn(self.config.recompute)
            return checkpoint(part, h, use_reentrant=False, context_fn=context)
        if not isinstance(part, nn.Sequential):  # only PipeDream's stashed weights run so
            raise ConfigError("streamed weights recompute blocks, not a stage's function")
        return self.streamed.recomputed(part, h)

    def stash(self) -> dict[str, torch.Tensor]:
        """A copy of the current weights that autograd can differentiate (PipeDream)."""
        return {
            name: p.detach().clone().requires_grad_(True)
            for name, p in self.module.named_parameters()
        }


def _pinned_like(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """An empty host tensor shaped as `t`, page-locked where `device` is a GPU (so copies
    to and from it can overlap the compute)."""
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=device.type == "cuda")


def first_leaf(block: nn.Module) -> nn.Module:
    for module in block.modules():
        if not list(module.children()):
            return module
    return block


def needs_input_copy(block: nn.Module) -> bool:
    """Whether the block begins with an in-place op, which a leaf that requires grad (a
    received stage input) cannot feed; such inputs get a cheap copy first."""
    return bool(getattr(first_leaf(block), "inplace", False))


def _parts(module: nn.Sequential) -> list[nn.Module]:
    """The blocks of `module` grouped by pipecast.values.profile.segments; a cut that would start at
    a block beginning with an in-place op (which a leaf cannot feed) moves past it."""
    blocks = list(module)
    ranges = segments([sum(1 for p in b.parameters() if p.requires_grad) for b in blocks])
    starts: list[int] = []
    for start, _ in ranges[1:]:
        while start < len(blocks) and needs_input_copy(blocks[start]):
            start += 1
        if start < len(blocks) and (not starts or start > starts[-1]):
            starts.append(start)
    if not starts:
        return [module]
    bounds = [0, *starts, len(blocks)]
    return [module[a:b] for a, b in itertools.pairwise(bounds)]
