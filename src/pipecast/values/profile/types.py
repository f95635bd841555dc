"""Profile: what each block of a model costs, measured at several micro-batch sizes.

Times are seconds, sizes bytes. A Profile is pure data: the partitioner, the simulator and the
recommender read it, the profiler writes it, and its JSON form (pipecast.values.profile.jsonform)
moves it between them. Costs at sizes the profiler did not measure are interpolated
(pipecast.values.profile.interpolate); a stage's are sums over its blocks, in O(1) per stage after
the first.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Literal

from pipecast import jsonio
from pipecast.errors import ConfigError
from pipecast.values.profile import interpolate, jsonform
from pipecast.values.profile.host_readings import HostReadings
from pipecast.values.profile.interpolate import interp
from pipecast.values.profile.segments import segments
from pipecast.values.profile.stage_memory import backward_peak
from pipecast.values.training import Compile

FORMAT_VERSION = jsonform.FORMAT_VERSION
SMALL_REQUEST = 2**20
"""The largest request torch's caching allocator serves from its small (2 MiB) segments."""
Dtype = Literal["fp32", "bf16", "fp16"]
BATCHED_WEIGHT_GROUP = 4
"""Micro-batches the profiler runs as one batched W (BlockCost.batched_weight)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockCost:
    """One block at one micro-batch size."""

    forward: float
    backward_input: float
    """B: gradient with respect to the block's input only."""
    backward_weight: float
    """W: gradient with respect to the block's parameters, given the output gradient."""
    batched_weight: float = 0.0
    """W per micro-batch where BATCHED_WEIGHT_GROUP micro-batches' run as one
    (Plan.weight_batch; 0: not measured, and 0 with the W of a first block)."""
    backward: float
    """The whole backward in one pass (what GPipe and 1F1B run); about B + W."""
    output_bytes: int
    """Bytes of the block's output: what crosses a stage boundary after it."""
    saved_bytes: int
    """Activation bytes the block keeps for backward, not counting tensors an earlier block
    already keeps (a ReLU output that the next conv saves again is counted once)."""
    peak_bytes: int = 0
    """Transient memory beyond inputs and saved tensors at the block's peak (0: unmeasured)."""
    spread: float = 0.0
    """Relative spread of forward + backward time across repeats."""
    held_bytes: int = 0
    """Output gradients B captures and keeps until W (zero-bubble schedules' extra memory)."""
    selective_bytes: int | None = None
    """Bytes the block keeps for its backward as a selective checkpoint of its own, beyond
    its input: the outputs of its matrix products and attention (pipecast.runtime
    .recompute; None: not measured, as in profiles taken before)."""
    host_forward: float = 0.0
    """Seconds the host takes to issue the forward (0: unmeasured). When it exceeds the
    device time, the device waits for the host: the block is host-bound."""
    host_backward_input: float = 0.0
    host_backward_weight: float = 0.0
    host_backward: float = 0.0
    graph_forward: float = 0.0
    """Device seconds of the forward replayed as a CUDA graph, as a graphed stage runs it
    (pipecast.runtime.graphs): the device's own time, its host out of the way (0: not
    measured; see Profile.graph_times)."""
    graph_backward: float = 0.0
    """Device seconds of the whole backward replayed as a CUDA graph."""
    graph_pool: int = 0
    """Bytes the block's own slot pool reserved when it was captured alone as the runtime's
    graphs (0: not measured): what its forward, backward and transients take in a capture,
    which the eager peak can undercount (GPT's attention backward takes a segment of its own
    in a slot, twice its eager transient; docs/decisions.md, "What a graphed rank holds
    (memory)")."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockProfile:
    index: int
    name: str
    params: int
    param_bytes: int
    input_counted: bool
    """Whether `saved_bytes` already includes the block's input tensor."""
    costs: dict[int, BlockCost]
    """Micro-batch size -> cost."""
    optimizer_step: float = 0.0
    """Seconds of one optimizer step over this block's parameters."""
    param_tensors: int = 0
    """Trainable parameter tensors (torch's DDP hooks and copies each one)."""
    buffer_tensors: int = 0
    """Buffer tensors (torch's DDP broadcasts them before every forward)."""
    kept_workspace: int | None = None
    """Bytes the math libraries keep for a stream once this block ran on it: cuBLAS's
    workspaces where it calls cuBLAS, 0 where it calls none (measure.kept_workspace; None:
    not measured, and every stage is taken to keep Profile.floor_bytes)."""
    large_param_bytes: int | None = None
    """Bytes of the parameters larger than the allocator's small requests
    (allocator.SMALL_REQUEST): their gradients take large segments (None: not measured)."""
    tp_reduces: tuple[int, int] | None = None
    """A block split by tensor parallelism (Profile.tensor_parallel): the all-reduces its
    forward and its backward each add, one per row-wise projection in the forward (its
    partial output) and one per column-wise projection in the backward (torch's
    ColwiseParallel all-reduces each one's input gradient on its own); None: not recorded."""
    forward_flops: int | None = None
    """FLOPs of the block's forward for one sample, counted (not timed) by torch's
    FlopCounterMode: matrix products, convolutions and attention, 2 per multiply-add
    (pipecast.values.profile.flops; None: not counted, as in profiles taken before)."""

    @property
    def large_params(self) -> int:
        """large_param_bytes, or for profiles without it all of the parameters where their
        average tensor is a large request, else none."""
        if self.large_param_bytes is not None:
            return self.large_param_bytes
        tensors = max(self.param_tensors, 1)
        return self.param_bytes if self.param_bytes / tensors > SMALL_REQUEST else 0


@dataclass(frozen=True, kw_only=True)
class StageCost:
    """The sum over a contiguous block range [start, stop) at one micro-batch size."""

    forward: float
    backward_input: float
    backward_weight: float
    backward: float
    batched_weight: float = 0.0
    """BlockCost.batched_weight summed (0 where any block lacks it)."""
    input_bytes: int
    """Bytes received from the previous stage (0 for the first stage)."""
    output_bytes: int
    """Bytes sent to the next stage."""
    activation_bytes: int
    """Bytes held per micro-batch in flight: saved activations plus the received input."""
    param_bytes: int
    peak_bytes: int
    optimizer_step: float
    held_bytes: int = 0
    """Bytes kept from B until W under a split backward."""
    host_forward: float = 0.0
    host_backward_input: float = 0.0
    host_backward_weight: float = 0.0
    host_backward: float = 0.0
    graph_forward: float = 0.0
    """Device seconds of the forward as CUDA graphs (the loss's eager forward included on
    the last stage; 0 where the profile has no graph times)."""
    graph_backward: float = 0.0
    kept_workspace: int = 0
    """Bytes the math libraries keep for each stream this stage runs on (the most any of
    its blocks keeps: BlockProfile.kept_workspace)."""


@dataclass(frozen=True, kw_only=True)
class Profile:
    """Per-block costs of one model on one device type, at several micro-batch sizes."""

    model: str
    dataset: str
    workload: dict[str, Any] = field(default_factory=dict)
    device: str
    dtype: Dtype
    autocast: bool = False
    torch_version: str
    micro_batch_sizes: tuple[int, ...]
    input_bytes_per_sample: int
    blocks: tuple[BlockProfile, ...]
    loss: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Micro-batch size -> (forward, backward) seconds of the loss on the last output."""
    loss_alone: dict[int, tuple[float, float, float, float]] = field(default_factory=dict)
    """Micro-batch size -> the loss's forward and backward as a graphed last stage runs
    them eagerly: device seconds with the host's issuing hidden, then host seconds (taken
    with the graph times; empty without them)."""
    graph_pool: dict[int, int] = field(default_factory=dict)
    """Micro-batch size -> bytes the whole model's graphs reserved as one slot (taken with
    the graph times; empty without them)."""
    created: str = ""
    optimizer_fixed: float = 0.0
    """Seconds every stage's optimizer step costs beyond its blocks' shares (launching the
    update); blocks' `optimizer_step` hold only what their bytes add."""
    target_bytes_per_sample: int = 0
    """Bytes of one sample's target (0: not recorded; profiles before it)."""
    floor_bytes: int = 0
    """Device bytes a training process holds whatever its model: the math libraries'
    workspaces (cuBLAS keeps one per thread and stream, and the backward runs on autograd's
    own thread). Every GPU's peak includes them."""
    issue_hidden: bool = False
    """Whether the in-context passes of every size timed the device with the host's issuing
    hidden (ProfileOptions.hide_issue), so that device times are the device's alone (False
    where a pass waited on its device and hiding was given up)."""
    graph_times: bool = False
    """Whether every block at every size has device times as CUDA graph replays
    (BlockCost.graph_forward, graph_backward; ProfileOptions.graph_times on a GPU)."""
    graph_failure: str = ""
    """Why a profile that tried to time CUDA graphs has none (the capture's error)."""
    compiled: Compile = "off"
    """How the blocks ran: eager ('off') or each as inductor-compiled code ('blocks',
    RunConfig.compile), its backward split for B and W as a zero-bubble stage runs it."""
    compile_seconds: float = 0.0
    """Wall seconds the first pass took to compile the blocks (0 where nothing compiled,
    or everything came from inductor's cache)."""
    channels_last: bool = False
    """Convolutions ran in channels-last memory order (RunConfig.channels_last)."""
    float8: bool = False
    """Linears ran in Float8 (RunConfig.float8)."""
    tiled: str = ""
    """Where the blocks are a few measured layers repeated to the model's depth (a model too
    large to profile whole, values/profile/tile.py): what was measured and what tiled;
    empty where every block was measured."""
    shared_compute: dict[int, float] = field(default_factory=dict)
    """CPU profiles: n -> how much slower the model's forward and backward ran in each of n
    ranks computing at once (each with the runtime's cores // n threads) than in the
    profiler's one process (hardware.host_probe.shared_compute; empty: not measured)."""
    host: HostReadings = field(default_factory=HostReadings)
    """How fast the host ran while these costs were read."""
    tensor_parallel: dict[int, tuple[BlockProfile, ...]] = field(default_factory=dict)
    """Degree t -> every block as one of t tensor-parallel ranks runs it: a block with a
    TP plan profiled at its sharded shapes (its collectives priced apart), the others as
    they are (empty: not profiled)."""
    shares: int = 0
    """Above 1: a model too large for one GPU whole, profiled as one of `shares`
    tensor-parallel ranks alone. Its blocks are that rank's shares, standing in for the
    whole ones, so it prices tensor parallelism of that degree and no other (0: the whole
    blocks were measured)."""

    @property
    def execution(self) -> tuple[Compile, bool, bool]:
        """How the blocks ran (compiled, channels_last, float8): a strategy that runs them
        so is priced from this profile (Strategy.execution)."""
        return (self.compiled, self.channels_last, self.float8)

    def at_tensor_parallel(self, degree: int) -> Profile:
        """The profile of one of `degree` tensor-parallel ranks (degree 1: this one)."""
        if self.shares > 1 and degree != self.shares:
            raise ConfigError(
                f"the profile of {self.model} holds one of {self.shares} tensor-parallel "
                f"ranks' shares of each block, not the whole blocks: it prices tensor "
                f"parallelism {self.shares} alone, not {degree}"
            )
        if degree == 1:
            return self
        if degree not in self.tensor_parallel:
            profiled = sorted(self.tensor_parallel) or "none"
            raise ConfigError(
                f"the profile of {self.model} has no tensor-parallel costs for degree "
                f"{degree} (profiled: {profiled}): profile it with --tensor-parallel {degree}"
            )
        if degree not in self._tp_ranks:  # one object a degree: its costs' caches kept
            self._tp_ranks[degree] = replace(
                self, blocks=self.tensor_parallel[degree], tensor_parallel={}
            )
        return self._tp_ranks[degree]

    def compute_factor(self, busy: int) -> float | None:
        """shared_compute at the nearest count measured at or below `busy` (1 for one
        rank; None where nothing was measured)."""
        if not self.shared_compute:
            return None
        known = [n for n in self.shared_compute if n <= busy]
        return self.shared_compute[max(known)] if known else 1.0

    # ---- costs at any micro-batch size -------------------------------------------------

    def cost(self, block: int, micro_batch: int) -> BlockCost:
        """Block `block` at `micro_batch`: measured, else interpolated (times piecewise
        linear in the micro-batch size, bytes exactly proportional)."""
        return self._interpolated(micro_batch)[block]

    def stage(self, start: int, stop: int, micro_batch: int) -> StageCost:
        """Total cost of blocks [start, stop) at `micro_batch`, in O(1) after the first call."""
        if not 0 <= start < stop <= len(self.blocks):
            raise ConfigError(
                f"block range [{start}, {stop}) is outside the model's {len(self.blocks)} blocks"
            )
        t = self._table(micro_batch)
        costs = self._interpolated(micro_batch)
        in_bytes = costs[start - 1].output_bytes if start else 0
        # the runtime holds a stage's received input until its backward, saved or not
        held = 0 if (start == 0 or self.blocks[start].input_counted) else in_bytes
        fwd, b, w, bw, gf, gb = (
            t[k][stop] - t[k][start] for k in ("f", "b", "w", "bw", "gf", "gb")
        )
        if stop == len(self.blocks):  # the loss, on the last stage
            lf, lb = self.loss_cost(micro_batch)
            fwd, b, bw = fwd + lf, b + lb, bw + lb
            if self.graph_times:
                alone = self.loss_alone_cost(micro_batch)
                df, db = alone if alone else (lf, lb)
                gf, gb = gf + df, gb + db
        batched = all(c.batched_weight > 0 or c.backward_weight <= 0 for c in costs[start:stop])
        return StageCost(
            forward=fwd,
            backward_input=b,
            backward_weight=w,
            backward=bw,
            batched_weight=t["wb"][stop] - t["wb"][start] if batched else 0.0,
            input_bytes=in_bytes,
            output_bytes=costs[stop - 1].output_bytes if stop < len(self.blocks) else 0,
            activation_bytes=int(t["saved"][stop] - t["saved"][start]) + held,
            param_bytes=int(t["param"][stop] - t["param"][start]),
            peak_bytes=backward_peak(costs, t["saved"], start, stop),
            optimizer_step=t["opt"][stop] - t["opt"][start] + self.optimizer_fixed,
            held_bytes=int(t["held"][stop] - t["held"][start]),
            host_forward=t["hf"][stop] - t["hf"][start],
            host_backward_input=self._host_split(t["hb"][stop] - t["hb"][start], start, stop),
            host_backward_weight=t["hw"][stop] - t["hw"][start],
            host_backward=t["hbw"][stop] - t["hbw"][start],
            graph_forward=gf if self.graph_times else 0.0,
            graph_backward=gb if self.graph_times else 0.0,
            kept_workspace=self.kept_workspace(start, stop),
        )

    def kept_workspace(self, start: int, stop: int) -> int:
        """Bytes the math libraries keep for a stream that blocks [start, stop) ran on:
        the most any of them keeps (cuBLAS's workspaces are one per thread and stream,
        shared by every call); Profile.floor_bytes where a block was not measured."""
        key = (start, stop)
        if key not in self._kept:
            kept = [b.kept_workspace for b in self.blocks[start:stop]]
            self._kept[key] = (
                self.floor_bytes if any(k is None for k in kept) else max(k or 0 for k in kept)
            )
        return self._kept[key]

    def _host_split(self, isolated: float, start: int, stop: int) -> float:
        """Host seconds of B over blocks [start, stop) whose lone calls add up to
        `isolated`: the call's own cost once per segment the runtime cuts the stage into
        (pipecast.values.profile.segments), not once per block."""
        calls = self._segment_calls.get((start, stop))
        if calls is None:
            counts = [b.param_tensors for b in self.blocks[start:stop]]
            calls = self._segment_calls[(start, stop)] = len(segments(counts))
        call = self.host.split_call
        return max(isolated - (stop - start - calls) * call, calls * call)

    def loss_cost(self, micro_batch: int) -> tuple[float, float]:
        if not self.loss:
            return 0.0, 0.0
        sizes = sorted(self.loss)
        f = interp(sizes, [self.loss[s][0] for s in sizes], micro_batch)
        b = interp(sizes, [self.loss[s][1] for s in sizes], micro_batch)
        return f, b

    def loss_alone_cost(self, micro_batch: int) -> tuple[float, float] | None:
        """The loss's device times at `micro_batch` with its issuing hidden (`loss_alone`;
        None: not measured)."""
        if not self.loss_alone:
            return None
        sizes = sorted(self.loss_alone)
        f, b = (interp(sizes, [self.loss_alone[s][i] for s in sizes], micro_batch) for i in (0, 1))
        return f, b

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def param_bytes(self) -> int:
        return sum(b.param_bytes for b in self.blocks)

    @property
    def params(self) -> int:
        return sum(b.params for b in self.blocks)

    @property
    def forward_flops(self) -> int | None:
        """The whole model's forward FLOPs for one sample (None: a block is not counted). A
        profile of one rank's shares (`shares`) counted each split block's share: the
        whole block computes `shares` times that."""
        counts = [b.forward_flops for b in self.blocks]
        if any(n is None for n in counts):
            return None
        split = self.tensor_parallel.get(self.shares, ()) if self.shares > 1 else ()
        ranks = [self.shares if b.tp_reduces is not None else 1 for b in split]
        return sum((n or 0) * k for n, k in zip(counts, ranks or [1] * len(counts), strict=True))

    @cached_property
    def _cache(self) -> dict[int, Any]:
        return {}

    @cached_property
    def _tp_ranks(self) -> dict[int, Profile]:
        """at_tensor_parallel's profiles by degree (a search asks for each thousands of
        times, and each fresh one interpolated its costs again)."""
        return {}

    @cached_property
    def _segment_calls(self) -> dict[tuple[int, int], int]:
        return {}

    @cached_property
    def _kept(self) -> dict[tuple[int, int], int]:
        return {}

    def _interpolated(self, micro_batch: int) -> list[BlockCost]:
        key = -micro_batch
        if key not in self._cache:
            if micro_batch < 1:
                raise ConfigError(f"micro-batch size must be at least 1, got {micro_batch}")
            self._cache[key] = [interpolate.block_cost(b.costs, micro_batch) for b in self.blocks]
        result: list[BlockCost] = self._cache[key]
        return result

    def _table(self, micro_batch: int) -> dict[str, list[float]]:
        if micro_batch not in self._cache:
            costs = self._interpolated(micro_batch)
            table: dict[str, list[float]] = {
                k: [0.0]
                for k in (
                    "f",
                    "b",
                    "w",
                    "bw",
                    "saved",
                    "saved_large",
                    "param",
                    "param_large",
                    "opt",
                    "held",
                    "hf",
                    "hb",
                    "hw",
                    "hbw",
                    "gf",
                    "gb",
                    "wb",
                )
            }
            inputs = [self.input_bytes_per_sample * micro_batch] + [
                c.output_bytes for c in costs[:-1]
            ]
            for block, c, in_bytes in zip(self.blocks, costs, inputs, strict=True):
                large = max(in_bytes, c.output_bytes) > SMALL_REQUEST  # its tensors' size
                for key, value in (
                    ("f", c.forward),
                    ("b", c.backward_input),
                    ("w", c.backward_weight),
                    ("wb", c.batched_weight),
                    ("bw", c.backward),
                    ("saved", c.saved_bytes),
                    ("saved_large", c.saved_bytes if large else 0),
                    ("param", block.param_bytes),
                    ("param_large", block.large_params),
                    ("opt", block.optimizer_step),
                    ("held", c.held_bytes),
                    ("hf", c.host_forward),
                    ("hb", c.host_backward_input),
                    ("hw", c.host_backward_weight),
                    ("hbw", c.host_backward),
                    ("gf", c.graph_forward),
                    ("gb", c.graph_backward),
                ):
                    table[key].append(table[key][-1] + value)
            self._cache[micro_batch] = table
        result: dict[str, list[float]] = self._cache[micro_batch]
        return result

    # ---- JSON ----------------------------------------------------------------------------

    def to_json(self) -> str:
        return jsonform.dump(self)

    @classmethod
    def from_json(cls, text: str, source: str = "<string>") -> Profile:
        """A profile from its JSON text (format version 2, or 1, upgraded as it is read)."""
        profile: Profile = jsonform.load(cls, text, source)
        return profile

    @classmethod
    def load(cls, path: str) -> Profile:
        return cls.from_json(jsonio.read_text(path), source=path)

    def save(self, path: str) -> None:
        jsonio.write_atomic(path, self.to_json())
