"""The engine: executes one rank's share of a validated Plan, exactly as planned.

The same Plan the simulator consumed drives this loop, action by action: F receives its input
(from the data, a local stage, or a channel), runs the stage and sends its output; B or BW
receives the output gradient, runs the backward (split or whole) and sends the input gradient;
W computes the weight gradients B deferred. Under a split backward a stage's forward runs as
one autograd graph per segment of its blocks (pipecast.values.profile.segments), so that W's calls
walk only their own segment. After a stage's last backward its gradients are
all-reduced across data-parallel replicas (bucketed, overlapping the rest of the step); then
every stage steps its optimizer. PipeDream plans update after every micro-batch, each backward
using the weights its forward used. On GPUs the steps after the first replay CUDA graphs
(pipecast.runtime.replay).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from pipecast.errors import ConfigError
from pipecast.runtime import allreduce, context, devices, graphs, microbatch, sharding, ties
from pipecast.runtime.backward import Cut
from pipecast.runtime.channels import Channels, cached_group
from pipecast.runtime.config import RunConfig
from pipecast.runtime.events import ActionClock
from pipecast.runtime.gradients import LossScaler, clip_global_norm
from pipecast.runtime.micro_backward import Micro, run_backward
from pipecast.runtime.offload import HostActivations
from pipecast.runtime.replay import Replay
from pipecast.runtime.send_plan import Posting
from pipecast.runtime.shape_agreement import ShapeAgreement
from pipecast.runtime.sharded_optimizer import shard_optimizers
from pipecast.runtime.stage import StageModule
from pipecast.runtime.step_result import StepResult, StepRun, charge, tick
from pipecast.runtime.watchdog import Watchdog
from pipecast.runtime.weight_batch import Deferred, run_group
from pipecast.runtime.weight_stream import hooks_of
from pipecast.values.parallel import Layout
from pipecast.values.plan.action import Action, Plan
from pipecast.values.plan.validate import validate
from pipecast.values.training import offloads_activations, recomputes, why_not_streamed

LossFn = Callable[[torch.Tensor, Any], torch.Tensor]


class PipelineEngine:
    """Runs steps of `plan` for pipeline rank `pipeline_rank` of replica `replica`."""

    def __init__(
        self,
        plan: Plan,
        stages: dict[int, StageModule],
        *,
        pipeline_rank: int,
        replica: int = 0,
        replicas: int = 1,
        loss_fn: LossFn | None,
        config: RunConfig,
        device: torch.device,
        tied: list[ties.Tie] | None = None,
        layout: Layout | None = None,
        tensor: int = 0,
        context_rank: int = 0,
    ) -> None:
        validate(plan)
        if plan.async_updates and replicas > 1:
            raise ConfigError(
                "PipeDream's asynchronous updates with data-parallel replicas "
                "are not supported: use replicas=1 or a synchronous schedule"
            )
        if why := why_not_streamed(config.offload, config.recompute, plan.async_updates):
            raise ConfigError(why)
        own = set(plan.stages_of(pipeline_rank))
        if set(stages) != own:
            raise ConfigError(
                f"pipeline rank {pipeline_rank} runs stages {sorted(own)} but was "
                f"given {sorted(stages)}"
            )
        self.plan, self.stages, self.config, self.device = plan, stages, config, device
        self.offload = (
            HostActivations(device)
            if offloads_activations(config.offload) and not plan.forward_only
            else None
        )
        self.rank, self.replica, self.replicas = pipeline_rank, replica, replicas
        self.loss_fn = loss_fn
        self.scaler = LossScaler(
            0.0 if plan.async_updates else config.initial_loss_scale,
            config.loss_scale_interval,
        )
        """Dynamic loss scaling (scale 0: off); the same on every rank."""
        self._params = [p for st in stages.values() for p in st.params]
        """Every trainable parameter this rank holds, for what touches all their gradients."""
        self.ties = tied or []
        """Parameters shared with other stages (pipecast.runtime.ties)."""
        self._uncounted = ties.uncounted(self.ties)
        """Copies of tied parameters the global gradient norm leaves out."""
        layout = layout or Layout(replicas=replicas, pipeline=plan.num_ranks)
        self.global_rank = layout.rank(
            replica=replica, pipeline=pipeline_rank, context=context_rank, tensor=tensor
        )
        self.channels = Channels(
            plan,
            pipeline_rank,
            replica,
            replicas,
            device,
            config.timeout_s,
            layout,
            tensor,
            context_rank,
        )
        self.copies = replicas * layout.context
        """Ranks holding the same weights and summing their gradients: every replica's
        context ranks (pipecast.runtime.context)."""
        self.context_degree = layout.context
        self.context_group = context.context_group(layout, self.global_rank)
        """The ranks splitting this rank's sequences (None: it holds them whole)."""
        self.dp_group: dist.ProcessGroup | None = None
        """The replicas' (and their context ranks') group for pipecast's own all-reduce
        (None: one copy of the weights, or FSDP reduce-scatters the gradients itself)."""
        sharded = any(st.mesh.dp is not None for st in stages.values())
        self.summed = 1 if sharded else self.copies
        """Ranks whose gradients are summed (pipecast's all-reduce); 1 where FSDP
        averages them."""
        if self.copies > 1 and not sharded:
            for t in range(layout.tensor):  # collective: every rank creates every group, in order
                for r in range(layout.pipeline):
                    ranks = context.gradient_ranks(layout, r, t)
                    group = cached_group(ranks, "dp")
                    if (r, t) == (pipeline_rank, tensor):
                        self.dp_group = group
        if config.shard_optimizer:  # each replica keeps its share's state
            shard_optimizers(stages, self.dp_group)
        self.clock = ActionClock(device, config.record_events)
        self.watchdog = Watchdog(plan, pipeline_rank, self.global_rank, config.timeout_s)
        self.watchdog.__enter__()
        self.posting = Posting(
            plan, pipeline_rank, self.channels, planned=config.send_timing == "planned"
        )
        self._last_backward = {s: self._last_backward_index(s) for s in stages}
        self._last_sync = {
            s: self._last_backward_index(s, ("B", "BW") if st.first else None)
            for s, st in stages.items()
        }
        """Where each FSDP stage reduce-scatters in a pipeline: its last backward action
        with work in it (the first stage's B is its whole backward, its W empty)."""
        graphs.check(plan, config, device.type)
        self.stream = (
            torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
            if device.type == "cuda"
            else None
        )
        """The stream every step runs on, eager and graphed (pipecast.runtime.graphs)."""
        self.agreement = ShapeAgreement(self.global_rank)
        self.replay = Replay(self) if graphs.enabled(plan, config, device.type) else None
        """The graphed path (pipecast.runtime.replay); None: every step runs eagerly."""
        # a host optimizer steps each block as its gradients leave, where nothing needs
        # the whole gradients on the device first and autograd's hooks run (host_step)
        overlap = not (
            self.replay is not None
            or self.scaler.scale
            or config.clip_grad_norm > 0
            or self.dp_group is not None
            or sharded
            or plan.async_updates
            or plan.split_backward
            or self.ties
        )
        for st in stages.values():
            if st.host_step is not None:
                st.host_step.overlap = overlap

    def close(self) -> None:
        self.watchdog.__exit__()

    def _last_backward_index(self, stage: int, kinds: tuple[str, ...] | None = None) -> int:
        kinds = kinds or (("W",) if self.plan.split_backward else ("BW",))
        positions = [
            i
            for i, a in enumerate(self.plan.actions[self.rank])
            if a.stage == stage and a.kind in kinds
        ]
        return max(positions, default=-1)

    # ---- one step ----------------------------------------------------------------------

    def step(self, inputs: Any = None, targets: Any = None) -> StepResult:
        """One training (or inference) step. The rank holding stage 0 passes `inputs`, the
        rank holding the last stage `targets`; other ranks pass nothing."""
        plan, m = self.plan, self.plan.num_microbatches
        first, last = 0 in self.stages, plan.num_stages - 1 in self.stages
        if first and inputs is None:
            raise ConfigError(f"rank {self.global_rank} holds stage 0 and needs the inputs")
        if last and targets is None and not plan.forward_only:
            raise ConfigError(f"rank {self.global_rank} holds the last stage and needs targets")
        began = time.perf_counter()
        devices.reset_peak(self.device)
        self.watchdog.at(None, "agreeing on the step's input shape")
        local_batch = self.agreement.agree(inputs)
        replay = self.replay
        graphed = replay is not None and replay.ready(self.agreement.key)
        captured = replay.graphs if replay is not None and graphed else None
        landing = captured.receives() if captured is not None else None
        self.channels.begin_step(known_shapes=self.agreement.known, targets=landing)
        with self._on_stream(graphed):
            in_mbs = (
                microbatch.split(microbatch.to_device(inputs, self.device), m) if first else None
            )
            tg_mbs = (
                microbatch.split(microbatch.to_device(targets, self.device), m)
                if last and targets is not None
                else None
            )
            # a micro-batch's loss counts its share of the samples the gradients are summed
            # over: every replica's (and context rank's, each holding as many of a
            # sample's tokens) under pipecast's all-reduce, this replica's alone where FSDP
            # averages the replicas' gradients
            total = local_batch * self.summed
            self.clock.start_step()
            self.posting.begin_step()
            loop_began = time.perf_counter()
            host_before = loop_began - began
            if replay is not None and graphed:
                run = replay.run(in_mbs, tg_mbs)
            else:
                run = self._eager_actions(in_mbs, tg_mbs, total)
            self.posting.flush()
            host_loop = time.perf_counter() - loop_began
            run.host["transfer"] = self.channels.host_seconds
            norm, skipped, scale = self._finish_step(run.pending_reduce)
            marks = self.clock.take()
            loss_sum = run.loss_sum
            if loss_sum is not None and self.context_group is not None:
                # each context rank's share of the mean: the replica's loss is their sum
                dist.all_reduce(loss_sum, group=self.context_group)
                loss_sum = loss_sum / self.context_degree
            loss_value = float(loss_sum.item()) * self.summed if loss_sum is not None else None
        if replay is not None and not graphed and replay.learning():
            self.watchdog.at(None, "capturing CUDA graphs")
            replay.capture(total)
        self.watchdog.idle()
        return StepResult(
            loss=loss_value,
            seconds=time.perf_counter() - began,
            marks=marks,
            peak_allocated=devices.peak_allocated(self.device)
            + (captured.pool_bytes if captured is not None else 0),
            peak_reserved=devices.peak_reserved(self.device),
            outputs=run.outputs,
            host=run.host,
            host_loop=host_loop,
            host_before=host_before,
            host_after=time.perf_counter() - loop_began - host_loop,
            grad_norm=float(norm) if norm is not None else None,
            skipped=skipped,
            loss_scale=scale,
            graphs_replayed=run.graphs_replayed,
        )

    @contextlib.contextmanager
    def _on_stream(self, graphed: bool) -> Iterator[None]:
        """Run a graphed step on the graphs' stream, after what the caller's stream holds
        (the batch, the zeroed gradients) and before whatever it issues next. Eager steps
        stay on the caller's stream: autograd's calls from other threads (W's, on the
        engine's device thread) sync with the streams their leaves were made on."""
        if self.stream is None or not graphed:
            yield
            return
        caller = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(caller)
        with torch.cuda.stream(self.stream):
            yield
        caller.wait_stream(self.stream)

    def _finish_step(self, pending_reduce: list[allreduce.Bucket]) -> tuple[Any, bool, float]:
        """After the action loop: wait for sends and all-reduces, unscale, clip, step the
        optimizers. (gradient norm or None, whether the step was skipped, the loss scale)"""
        plan = self.plan
        self.watchdog.at(None, "waiting for sends to complete")
        self.agreement.finish()
        self.channels.finish_sends()
        self.watchdog.at(None, "all-reducing gradients across replicas")
        allreduce.finish(pending_reduce)
        norm, skipped, scale = None, False, self.scaler.scale
        if not plan.forward_only and not plan.async_updates:
            if self.ties:
                self.watchdog.at(None, "summing the gradients of tied parameters")
                ties.sync(self.ties)
            if self.scaler.scale:
                self.watchdog.at(None, "unscaling the gradients")
                skipped = self.scaler.unscale(self._params, self.device)
            if self.config.clip_grad_norm > 0 and not skipped:
                self.watchdog.at(None, "clipping the gradients to their global norm")
                limit = self.config.clip_grad_norm
                norm = clip_global_norm(
                    self._params, limit, self.copies, self.device, self._uncounted
                )
            self.watchdog.at(None, "optimizer step")
            for st in self.stages.values():
                if not skipped:
                    st.step()
        return norm, skipped, scale

    def reduce_if_done(self, position: int, a: Action, pending: list[allreduce.Bucket]) -> None:
        """After a stage's last backward: start all-reducing its gradients over replicas."""
        if self._last_backward.get(a.stage) == position and self.dp_group is not None:
            grads = [
                sharding.local(p.grad) for p in self.stages[a.stage].params if p.grad is not None
            ]
            pending += allreduce.launch(grads, self.dp_group, self.config.bucket_bytes)

    def _eager_actions(
        self, in_mbs: list[Any] | None, tg_mbs: list[Any] | None, total: int
    ) -> StepRun:
        """The step's actions, each run op by op as the plan orders them."""
        plan = self.plan
        run = StepRun()
        state: dict[tuple[int, int], Micro] = {}
        local: dict[tuple[str, int, int], torch.Tensor] = {}
        deferred = Deferred(plan)  # W held back for a batch of micro-batches
        since = tick()
        for position, a in enumerate(plan.actions[self.rank]):
            self.posting.at(position)
            st = self.stages[a.stage]
            if a.kind == "F":
                x = self._input(a, in_mbs, local)
                mark = self.clock.begin()
                out, micro = self._forward(a, st, x)
                target = tg_mbs[a.mb] if st.last and tg_mbs is not None else None
                if self.replay is not None and self.replay.shapes is not None:
                    self.replay.shapes.forward(a, x, out, target)
                if st.last and not plan.forward_only:
                    assert target is not None and self.loss_fn is not None
                    scale = microbatch.size(target) / total
                    loss = self.loss_fn(out, target) * scale
                    loss_sum = run.loss_sum
                    run.loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
                    micro.out = loss * self.scaler.scale if self.scaler.scale else loss
                elif st.last:
                    run.outputs.append(out.detach())
                self.clock.end(mark, self.global_rank, str(a), "F", a.stage, a.mb)
                if not plan.forward_only:
                    state[(a.stage, a.mb)] = micro
                if not st.last:
                    self._deliver(a, out.detach(), local, "act", a.stage + 1)
            else:
                micro = state[(a.stage, a.mb)]
                if st.mesh.within_pipeline and st.mesh.dp is not None:
                    sharding.sync_at(st.module, self._last_sync[a.stage] == position)
                if a.kind == "W":
                    mark = self.clock.begin()
                    self.watchdog.at(a, "computing weight gradients")
                    if micro.mesh_weights is not None:
                        micro.mesh_weights.run()
                    run_group(deferred.take(a, micro.works), self.device)
                    del state[(a.stage, a.mb)]
                    self.clock.end(mark, self.global_rank, str(a), "W", a.stage, a.mb)
                else:
                    grad = self._output_grad(a, st, local)
                    if st.host_step is not None and self._last_backward.get(a.stage) == position:
                        st.host_step.last_backward()
                    mark = self.clock.begin()
                    self.watchdog.at(a, "computing the backward")
                    grad_in = run_backward(
                        a, st, micro, grad, async_updates=self.plan.async_updates
                    )
                    if a.kind == "BW":
                        del state[(a.stage, a.mb)]
                    self.clock.end(mark, self.global_rank, str(a), a.kind, a.stage, a.mb)
                    if a.stage > 0 and grad_in is not None:
                        self._deliver(a, grad_in, local, "grad", a.stage - 1)
            self.reduce_if_done(position, a, run.pending_reduce)
            since = charge(run.host, a.kind, since)
        return run

    def zero_grad(self) -> None:
        for st in self.stages.values():
            # a graph accumulates into .grad's own memory
            st.zero_grad(set_to_none=self.replay is None or self.replay.graphs is None)

    # ---- pieces ------------------------------------------------------------------------

    def _input(
        self, a: Action, in_mbs: list[Any] | None, local: dict[tuple[str, int, int], torch.Tensor]
    ) -> Any:
        st = self.stages[a.stage]
        if st.first:
            assert in_mbs is not None
            return in_mbs[a.mb]
        source = a.stage - 1
        if source in self.stages:
            return local.pop(("act", source, a.mb))
        src = self.plan.stage_to_rank[source]
        self.posting.flush()
        self.watchdog.at(a, f"waiting for the activation of micro-batch {a.mb} from rank {src}")
        return self.channels.recv(src, (source, "act", a.mb))

    def _forward(self, a: Action, st: StageModule, x: Any) -> tuple[torch.Tensor, Micro]:
        self.watchdog.at(a, "computing the forward")
        plan = self.plan
        needs_grad = (
            not plan.forward_only
            and not st.first
            and isinstance(x, torch.Tensor)
            and x.is_floating_point()
        )
        leaf = x.detach().requires_grad_(True) if needs_grad else None
        recompute = recomputes(self.config.recompute, a.mb, plan.num_microbatches)
        weights = None
        if plan.async_updates:
            weights = st.stash()
            st.version_log.append((a.mb, st.version))
        cuts: list[Cut] = []
        saving: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        # recomputed, the hooks see only what each checkpoint keeps, its input: offloaded
        # activations move those; streamed weights alone have nothing to mark
        if self.offload is not None or (st.streamed is not None and not recompute):
            saving = torch.autograd.graph.saved_tensors_hooks(*hooks_of(st.streamed, self.offload))
        if plan.forward_only:
            with torch.no_grad():
                out = st.forward(x)
        elif (
            plan.split_backward
            and self.config.cut_backward
            and leaf is not None
            and not weights
            and not st.meshed
        ):
            with saving:
                out, cuts = st.forward_cut(leaf, recompute=recompute)
        else:
            with saving:
                out = st.forward(
                    leaf if leaf is not None else x, recompute=recompute, weights=weights
                )
        return out, Micro(leaf=leaf, out=out, weights=weights, cuts=cuts)

    def _deliver(
        self,
        a: Action,
        tensor: torch.Tensor,
        local: dict[tuple[str, int, int], torch.Tensor],
        kind: str,
        consumer: int,
    ) -> None:
        if consumer in self.stages:
            local[(kind, a.stage, a.mb)] = tensor
            return
        self.posting.send(a, self.plan.stage_to_rank[consumer], (a.stage, kind, a.mb), tensor)

    def _output_grad(
        self, a: Action, st: StageModule, local: dict[tuple[str, int, int], torch.Tensor]
    ) -> torch.Tensor | None:
        if st.last:
            return None
        source = a.stage + 1
        if source in self.stages:
            return local.pop(("grad", source, a.mb))
        src = self.plan.stage_to_rank[source]
        self.posting.flush()
        self.watchdog.at(a, f"waiting for the gradient of micro-batch {a.mb} from rank {src}")
        return self.channels.recv(src, (source, "grad", a.mb))
