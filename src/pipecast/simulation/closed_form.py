"""The background studies' closed-form step-time models, kept beside the simulator so the
two can be compared (`pipecast simulate --compare-closed-form`).

* GPipe study: T = t1 + c1 + ... + tK + tmax (m - 1), where t_k is stage k's compute time per
  micro-batch (forward + backward), c_k the transfer after stage k, and tmax the slowest stage.
* The thesis's data-parallel model (its eq. 5.1): one replica's compute on its share of the
  batch plus the ring all-reduce of the gradients, 2 (N-1)/N x bytes / bandwidth.
* The thesis's GPipe models (eq. 6.1 and 6.2): (m + K - 1) x the slowest stage, without and with
  the boundary transfer added to each stage. (The thesis itself was not available to us; these
  are the standard forms its text describes, named after its equations.)
"""

from __future__ import annotations

from collections.abc import Sequence


def gpipe_study(
    stage_times: Sequence[float], transfers: Sequence[float], microbatches: int
) -> float:
    """t1 + c1 + ... + tK + tmax (m - 1)."""
    fill = sum(stage_times) + sum(transfers)
    return fill + max(stage_times) * (microbatches - 1)


def data_parallel(
    compute: float, gradient_bytes: float, replicas: int, bandwidth: float, latency: float = 0.0
) -> float:
    """Compute on one replica's share plus a ring all-reduce (eq. 5.1's form)."""
    if replicas <= 1:
        return compute
    return compute + latency + 2 * (replicas - 1) / replicas * gradient_bytes / bandwidth


def gpipe_no_comm(stage_times: Sequence[float], microbatches: int) -> float:
    """(m + K - 1) x max stage time (eq. 6.1's form)."""
    return (microbatches + len(stage_times) - 1) * max(stage_times)


def gpipe_with_comm(
    stage_times: Sequence[float], transfers: Sequence[float], microbatches: int
) -> float:
    """(m + K - 1) x max over stages of (compute + outgoing transfer) (eq. 6.2's form)."""
    padded = list(transfers) + [0.0] * (len(stage_times) - len(transfers))
    return (microbatches + len(stage_times) - 1) * max(
        t + c for t, c in zip(stage_times, padded, strict=True)
    )
