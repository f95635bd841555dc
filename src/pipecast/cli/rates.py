"""FLOP rates as the verbs print them: TFLOP/s per GPU and MFU (docs/flops.md)."""

from __future__ import annotations

from pipecast.planning.recommend.flops import TRAINING_PASSES
from pipecast.runtime import devices
from pipecast.runtime.job import TrainJob
from pipecast.values.hardware.load import default_cluster
from pipecast.values.hardware.peak import peak_rate
from pipecast.values.profile.flops import forward_flops, workload_flops


def tflops(per_second: float) -> str:
    """FLOP/s as TFLOP/s to the digits that mean something: whole ones from 100 up (412),
    three figures below (41.2, 0.0512)."""
    value = per_second / 1e12
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def measured_rate(job: TrainJob, step_time: float, *, inference: bool) -> str:
    """', 412 TFLOP/s per GPU, MFU 52% (of 789 ...)' for `job` at `step_time` seconds a
    step: its model FLOPs (3 forwards a sample, 1 for inference; recomputation not counted)
    over the step and its ranks, and on a GPU with a preset that much of the preset's
    measured bf16 matrix rate; '' where its model cannot be counted."""
    if job.workload is not None:
        counts = workload_flops(job.workload)
    elif job.model is not None:
        counts = forward_flops(list(job.model), job.spec)
    else:
        counts = None
    if counts is None or step_time <= 0:
        return ""
    passes = 1 if inference else TRAINING_PASSES
    per_gpu = passes * sum(counts) * job.batch / step_time / job.world
    if job.device == "cpu":
        return f", {tflops(per_gpu)} TFLOP/s per rank"
    name = devices.name(devices.resolve(job.device))
    peak = peak_rate(default_cluster(name, job.world), name)
    mfu = (
        f", MFU {per_gpu / peak.flops:.0%} (of {tflops(peak.flops)} TFLOP/s, {peak.name}'s "
        "measured bf16 rate)"
        if peak is not None
        else ""
    )
    return f", {tflops(per_gpu)} TFLOP/s per GPU{mfu}"
