"""Profile: what each block of a model costs, measured at several micro-batch sizes.

Times are seconds, sizes bytes. A Profile is pure data: the partitioner, the simulator and the
recommender read it, the profiler writes it, and its JSON form moves it between them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from pipecast import jsonio
from pipecast.errors import ConfigError, DataError
from pipecast.hardware.allocator import SMALL_REQUEST, slot_reserved
from pipecast.profile.segments import segments
from pipecast.profile.stage_memory import backward_peak, graph_slot
from pipecast.profile.stats import range_spread

FORMAT_VERSION = 1
Dtype = Literal["fp32", "bf16", "fp16"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockCost:
    """One block at one micro-batch size."""

    forward: float
    backward_input: float
    """B: gradient with respect to the block's input only."""
    backward_weight: float
    """W: gradient with respect to the block's parameters, given the output gradient."""
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
    which the eager peak can undercount (GPT's attention backward takes a 132 MiB segment
    of its own in a slot, against a 64 MiB eager transient)."""

    def to_json(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


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
    graph_host_forward: float = 0.0
    """Host seconds a graphed forward still issues op by op: the last stage's loss."""
    graph_host_backward: float = 0.0
    kept_workspace: int = 0
    """Bytes the math libraries keep for each stream this stage runs on (the most any of
    its blocks keeps: BlockProfile.kept_workspace)."""
    graph_slot_small: int = 0
    """Bytes one CUDA-graph slot of this stage holds at its fullest in requests the
    allocator serves from small segments, before it rounds them up (its input, activations,
    transient memory and the parameter gradients its backward returns, as they overlap)."""
    graph_slot_large: int = 0
    """... and in larger requests, at their own fullest (allocator.slot_reserved)."""


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
    micro_batches: tuple[int, ...]
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
    host_split_call: float = 0.0
    """Host seconds one split-backward B call costs whatever it covers (walking the graph,
    hooking it, entering autograd). Each block's `host_backward_input` was timed in a call of
    its own; a stage makes one call per segment (pipecast.profile.segments), so its B pays this
    once per segment."""
    host_reference: float = 0.0
    """hostspeed.reference() while profiling (the median of readings before and after each
    size): how fast the host ran when its times were taken (0: not recorded)."""
    host_issue: float = 0.0
    """hostspeed.issue() at the same points and after each host window beyond the sizes'
    own (the median of them all): the torch host work of a fixed tiny model, as fast as
    this process issued it while profiling (0: not recorded)."""
    host_machine: str = ""
    """hostspeed.machine() where the profile was taken (empty: not recorded)."""
    host_cpu: str = ""
    """hostspeed.cpu_model() where the profile was taken (empty: not recorded): host costs
    read on one CPU model do not describe another's."""
    host_pooled: int = 1
    """How many profiles' readings the host costs, the split-call cost, host_issue and
    host_reference are the mean of (pipecast.profile.pool; 1: this profile's own)."""
    size_issue: dict[int, float] = field(default_factory=dict)
    """Micro-batch size -> hostspeed.issue() read beside that size's host costs (the mean of
    readings just before and just after its whole-model passes, or without those passes the
    reading just after its per-block runs): the host's speed when those costs were read
    (empty: not recorded)."""
    host_windows: int = 1
    """Windows of whole-model passes each size's host costs are the median of
    (ProfileOptions.host_windows; 1 for profiles taken before there were more, 0 for
    profiles without whole-model passes)."""
    window_host: dict[int, tuple[float, ...]] = field(default_factory=dict)
    """Micro-batch size -> each window's host seconds issuing the whole model's forward and
    backward, in the order taken: how far the host's spells moved them (empty: not
    recorded)."""
    issue_hidden: bool = False
    """Whether the in-context passes of every size timed the device with the host's issuing
    hidden (ProfileOptions.hide_issue), so that device times are the device's alone (False
    where a pass waited on its device and hiding was given up)."""
    graph_times: bool = False
    """Whether every block at every size has device times as CUDA graph replays
    (BlockCost.graph_forward, graph_backward; ProfileOptions.graph_times on a GPU)."""
    graph_failure: str = ""
    """Why a profile that tried to time CUDA graphs has none (the capture's error)."""
    shared_compute: dict[int, float] = field(default_factory=dict)
    """CPU profiles: n -> how much slower the model's forward and backward ran in each of n
    ranks computing at once (each with the runtime's cores // n threads) than in the
    profiler's one process (hardware.host_probe.shared_compute; empty: not measured)."""

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
        ghf = ghb = 0.0
        if stop == len(self.blocks):  # the loss runs eagerly, graphed stages or not
            lf, lb = self.loss_cost(micro_batch)
            fwd, b, bw = fwd + lf, b + lb, bw + lb
            if self.graph_times:
                alone = self.loss_alone_cost(micro_batch)
                df, db, ghf, ghb = alone if alone else (lf, lb, 0.0, 0.0)
                gf, gb = gf + df, gb + db
        return StageCost(
            forward=fwd,
            backward_input=b,
            backward_weight=w,
            backward=bw,
            input_bytes=in_bytes,
            output_bytes=costs[stop - 1].output_bytes if stop < len(self.blocks) else 0,
            activation_bytes=int(t["saved"][stop] - t["saved"][start]) + held,
            param_bytes=int(t["param"][stop] - t["param"][start]),
            peak_bytes=backward_peak(costs, t["saved"], start, stop),
            **graph_slot(self.blocks, costs, t, start, stop, held),
            optimizer_step=t["opt"][stop] - t["opt"][start] + self.optimizer_fixed,
            held_bytes=int(t["held"][stop] - t["held"][start]),
            host_forward=t["hf"][stop] - t["hf"][start],
            host_backward_input=self._host_split(t["hb"][stop] - t["hb"][start], start, stop),
            host_backward_weight=t["hw"][stop] - t["hw"][start],
            host_backward=t["hbw"][stop] - t["hbw"][start],
            graph_forward=gf if self.graph_times else 0.0,
            graph_backward=gb if self.graph_times else 0.0,
            graph_host_forward=ghf,
            graph_host_backward=ghb,
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
        (pipecast.profile.segments), not once per block."""
        calls = self._segment_calls.get((start, stop))
        if calls is None:
            counts = [b.param_tensors for b in self.blocks[start:stop]]
            calls = self._segment_calls[(start, stop)] = len(segments(counts))
        call = self.host_split_call
        return max(isolated - (stop - start - calls) * call, calls * call)

    def loss_cost(self, micro_batch: int) -> tuple[float, float]:
        if not self.loss:
            return 0.0, 0.0
        sizes = sorted(self.loss)
        f = _interp(sizes, [self.loss[s][0] for s in sizes], micro_batch)
        b = _interp(sizes, [self.loss[s][1] for s in sizes], micro_batch)
        return f, b

    def loss_alone_cost(self, micro_batch: int) -> tuple[float, float, float, float] | None:
        """`loss_alone` at `micro_batch` (None: not measured): device times interpolated,
        host times the smallest size's (issuing costs the same at any size)."""
        if not self.loss_alone:
            return None
        sizes = sorted(self.loss_alone)
        f, b = (_interp(sizes, [self.loss_alone[s][i] for s in sizes], micro_batch) for i in (0, 1))
        return f, b, self.loss_alone[sizes[0]][2], self.loss_alone[sizes[0]][3]

    def window_spread(self) -> dict[int, float]:
        """Micro-batch size -> how far its windows' whole-model host times lay apart,
        (largest - smallest) / median, where it was read in more than one window."""
        return {mb: range_spread(v) for mb, v in self.window_host.items() if len(v) > 1}

    def graph_pool_factor(self, micro_batch: int) -> float:
        """How much memory a graphed stage's slot holds over what its tensors need at their
        fullest (StageCost.graph_slot_small and _large) in whole segments, as the whole model's pool
        measured it (`graph_pool`; 1.0 where not measured): blocks freed in the backward
        do not always fit what comes next, and the pool keeps what it once reserved."""
        if not self.graph_pool:
            return 1.0
        sizes = sorted(self.graph_pool)
        factors = []
        for s in sizes:
            whole = self.stage(0, len(self.blocks), s)
            model = slot_reserved(whole.graph_slot_small, whole.graph_slot_large)
            factors.append(self.graph_pool[s] / model if model > 0 else 1.0)
        inside = min(max(micro_batch, sizes[0]), sizes[-1])  # beyond the ends: the end's
        return max(_interp(sizes, factors, inside), 1.0)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def param_bytes(self) -> int:
        return sum(b.param_bytes for b in self.blocks)

    @property
    def params(self) -> int:
        return sum(b.params for b in self.blocks)

    @cached_property
    def _cache(self) -> dict[int, Any]:
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
            self._cache[key] = [_interp_cost(b.costs, micro_batch) for b in self.blocks]
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
        return jsonio.dump(
            "profile",
            FORMAT_VERSION,
            {
                "model": self.model,
                "dataset": self.dataset,
                "workload": self.workload,
                "device": self.device,
                "dtype": self.dtype,
                "autocast": self.autocast,
                "torch_version": self.torch_version,
                "micro_batches": list(self.micro_batches),
                "input_bytes_per_sample": self.input_bytes_per_sample,
                "created": self.created,
                "target_bytes_per_sample": self.target_bytes_per_sample,
                "floor_bytes": self.floor_bytes,
                "optimizer_fixed": self.optimizer_fixed,
                "host_split_call": self.host_split_call,
                "host_reference": self.host_reference,
                "host_issue": self.host_issue,
                "host_machine": self.host_machine,
                "host_cpu": self.host_cpu,
                "host_pooled": self.host_pooled,
                "size_issue": {str(mb): v for mb, v in self.size_issue.items()},
                "host_windows": self.host_windows,
                "window_host": {str(mb): list(v) for mb, v in self.window_host.items()},
                "issue_hidden": self.issue_hidden,
                "graph_times": self.graph_times,
                "graph_failure": self.graph_failure,
                "shared_compute": {str(n): f for n, f in self.shared_compute.items()},
                "loss": {str(k): list(v) for k, v in self.loss.items()},
                "loss_alone": {str(k): list(v) for k, v in self.loss_alone.items()},
                "graph_pool": {str(k): v for k, v in self.graph_pool.items()},
                "blocks": [
                    {
                        "index": b.index,
                        "name": b.name,
                        "params": b.params,
                        "param_bytes": b.param_bytes,
                        "input_counted": b.input_counted,
                        "optimizer_step": b.optimizer_step,
                        "param_tensors": b.param_tensors,
                        "buffer_tensors": b.buffer_tensors,
                        **_measured(
                            kept_workspace=b.kept_workspace, large_param_bytes=b.large_param_bytes
                        ),
                        "costs": {str(k): c.to_json() for k, c in b.costs.items()},
                    }
                    for b in self.blocks
                ],
            },
        )

    @classmethod
    def from_json(cls, text: str, source: str = "<string>") -> Profile:
        doc = jsonio.load("profile", FORMAT_VERSION, text, source)
        try:
            blocks = tuple(
                BlockProfile(
                    index=b["index"],
                    name=b["name"],
                    params=b["params"],
                    param_bytes=b["param_bytes"],
                    input_counted=b["input_counted"],
                    optimizer_step=b.get("optimizer_step", 0.0),
                    param_tensors=int(b.get("param_tensors", 0)),
                    buffer_tensors=int(b.get("buffer_tensors", 0)),
                    kept_workspace=_optional_int(b, "kept_workspace"),
                    large_param_bytes=_optional_int(b, "large_param_bytes"),
                    costs={int(k): BlockCost(**c) for k, c in b["costs"].items()},
                )
                for b in doc["blocks"]
            )
            return cls(
                model=doc["model"],
                dataset=doc["dataset"],
                workload=doc.get("workload", {}),
                device=doc["device"],
                dtype=doc["dtype"],
                autocast=doc.get("autocast", False),
                torch_version=doc["torch_version"],
                micro_batches=tuple(doc["micro_batches"]),
                input_bytes_per_sample=doc["input_bytes_per_sample"],
                blocks=blocks,
                loss={int(k): (v[0], v[1]) for k, v in doc.get("loss", {}).items()},
                graph_pool={int(k): int(v) for k, v in doc.get("graph_pool", {}).items()},
                loss_alone={
                    int(k): (v[0], v[1], v[2], v[3]) for k, v in doc.get("loss_alone", {}).items()
                },
                created=doc.get("created", ""),
                target_bytes_per_sample=int(doc.get("target_bytes_per_sample", 0)),
                floor_bytes=int(doc.get("floor_bytes", 0)),
                optimizer_fixed=float(doc.get("optimizer_fixed", 0.0)),
                host_split_call=float(doc.get("host_split_call", 0.0)),
                host_reference=float(doc.get("host_reference", 0.0)),
                host_issue=float(doc.get("host_issue", 0.0)),
                host_machine=str(doc.get("host_machine", "")),
                host_cpu=str(doc.get("host_cpu", "")),
                host_pooled=int(doc.get("host_pooled", 1)),
                size_issue={int(mb): float(v) for mb, v in doc.get("size_issue", {}).items()},
                host_windows=int(doc.get("host_windows", 1)),
                window_host={
                    int(mb): tuple(float(x) for x in v)
                    for mb, v in doc.get("window_host", {}).items()
                },
                issue_hidden=bool(doc.get("issue_hidden", False)),
                graph_times=bool(doc.get("graph_times", False)),
                graph_failure=str(doc.get("graph_failure", "")),
                shared_compute={int(n): float(f) for n, f in doc.get("shared_compute", {}).items()},
            )
        except (KeyError, TypeError) as exc:
            raise DataError(f"{source} is not a complete profile: missing {exc}") from None

    @classmethod
    def load(cls, path: str) -> Profile:
        return cls.from_json(jsonio.read_text(path), source=path)

    def save(self, path: str) -> None:
        jsonio.write_atomic(path, self.to_json())


def _measured(**values: int | None) -> dict[str, int]:
    """The values that were measured (None: not), as JSON keys: old profiles stay as read."""
    return {k: v for k, v in values.items() if v is not None}


def _optional_int(doc: dict[str, Any], key: str) -> int | None:
    value = doc.get(key)
    return None if value is None else int(value)


def _interp(xs: list[int], ys: list[float], x: int) -> float:
    """Piecewise-linear through (xs, ys); beyond the ends, the nearest segment's line
    (one point: proportional). Never below zero."""
    if len(xs) == 1:
        return ys[0] * x / xs[0]
    i = bisect.bisect_left(xs, x)
    if i < len(xs) and xs[i] == x:
        return ys[i]
    lo = min(max(i - 1, 0), len(xs) - 2)
    x0, x1, y0, y1 = xs[lo], xs[lo + 1], ys[lo], ys[lo + 1]
    value = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    if x < xs[0]:  # below the smallest size: never faster than proportional scaling
        value = max(value, ys[0] * x / xs[0])
    return max(value, 0.0)


def monotone(ys: list[float]) -> list[float]:
    """Times at rising micro-batch sizes, each capped by every larger size's: a smaller
    micro-batch never takes longer. Timing noise is one-sided (a host stall, a clock dip,
    an allocator call only lengthen a sample), so a small size measured slower than a larger
    one is noise, and the larger size's time bounds it."""
    out = list(ys)
    for i in range(len(out) - 2, -1, -1):
        out[i] = min(out[i], out[i + 1])
    return out


def _interp_cost(costs: dict[int, BlockCost], micro_batch: int) -> BlockCost:
    sizes = sorted(costs)
    near = min(sizes, key=lambda s: abs(s - micro_batch))
    base = costs[near]
    if len(sizes) == 1 and micro_batch == near:
        return base

    def t(name: str) -> float:
        return _interp(sizes, monotone([getattr(costs[s], name) for s in sizes]), micro_batch)

    def host(name: str) -> float:
        # Issuing a block's ops costs the host the same at any size (the same kernels, the
        # same Python). At the smallest size the device keeps up and never holds the host
        # back, so that reading is the host's own; a larger size reads dearer when a full
        # launch queue held the host, or cheaper when the host ran a fast spell (its speed
        # moves by up to 2x over seconds). The least over sizes picked the fastest spell:
        # re-predicting 169 configurations on five H200 machines, the smallest size's
        # reading gave a host-bound median error of 12.4% against the least's 19.6%.
        return float(getattr(costs[sizes[0]], name))

    def scaled(n: int) -> int:
        return n * micro_batch // near if micro_batch != near else n

    return BlockCost(
        forward=t("forward"),
        backward_input=t("backward_input"),
        backward_weight=t("backward_weight"),
        backward=t("backward"),
        output_bytes=scaled(base.output_bytes),
        saved_bytes=scaled(base.saved_bytes),
        peak_bytes=scaled(base.peak_bytes),
        spread=base.spread,
        held_bytes=scaled(base.held_bytes),
        host_forward=host("host_forward"),
        host_backward_input=host("host_backward_input"),
        host_backward_weight=host("host_backward_weight"),
        host_backward=host("host_backward"),
        graph_forward=t("graph_forward"),
        graph_backward=t("graph_backward"),
        graph_pool=scaled(base.graph_pool),
    )
