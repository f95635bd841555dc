"""The background studies' closed-form models, exactly as their documents write them, kept
beside the simulator so the two can be compared (`pipecast simulate --compare-closed-form`).

From the GPipe study (A. Shankar, "Analyzing the performance and scheduling of neural
networks that use pipeline parallelism", section 4.3):
* `gpipe_study`: time = t1 + c1 + t2 + c2 + t3 + tmax (m - 1), for any number of splits.
* `partition_efficiency`: sum of the stage costs S_i over k x S_max (its Tables 4.2, 4.3).

From the recommender study (M. Jansen, "A performance-based recommender system for
Distributed DNN training"), with the symbols of its Table 5.1:
* `horovod` (eq. 5.1): T_seq / W + 2 (W - 1) max_i (L_i,i+1 + min(G, th) / (W BW_i,i+1)).
* `gpipe_compute` (eq. 6.1): T_seq (W + #mb - 1) / (W #mb).
* `gpipe_communication` (eq. 6.2): twice the slowest link's time per lockstep step, summed
  over the steps that fill the pipeline, the #mb - (W - 2) steps it runs full, and the steps
  that drain it (`lockstep_links` from the links' times).

And the textbook bound the simulator must meet on equal stages, `fill_drain`: (m + K - 1)
x the slowest stage, with `fill_drain_with_comm` adding each stage's outgoing transfer.
"""

from __future__ import annotations

from collections.abc import Sequence


def gpipe_study(
    stage_times: Sequence[float], transfers: Sequence[float], microbatches: int
) -> float:
    """The GPipe study's time = t1 + c1 + ... + tK + tmax (m - 1): each stage's time per
    micro-batch t_k, the transfer c_k into the next stage (the receiver pulls it, so the study
    counts it in the next stage), and the slowest stage tmax for every further micro-batch."""
    fill = sum(stage_times) + sum(transfers)
    return fill + max(stage_times) * (microbatches - 1)


def partition_efficiency(stage_costs: Sequence[float]) -> float:
    """The GPipe study's partition efficiency: sum_i S_i / (k x S_max), 1 for equal stages."""
    return sum(stage_costs) / (len(stage_costs) * max(stage_costs))


def horovod(
    t_seq: float,
    workers: int,
    latency: Sequence[float],
    bandwidth: Sequence[float],
    gradients: float,
    threshold: float,
) -> float:
    """The recommender study's eq. 5.1: the time per batch of Horovod on W workers. `t_seq`
    is one GPU's time for the batch (s); `latency[i]` and `bandwidth[i]` are L_i,i+1 (s) and
    BW_i,i+1 (MB/s) of the ring's link from worker i to the next (the last one back to the
    first);
    `gradients` is G and `threshold` th, in MB: only the final all-reduce, of min(G, th),
    is exposed, and the ring's slowest link sets its pace."""
    if len(latency) != workers or len(bandwidth) != workers:
        raise ValueError("eq. 5.1 needs one latency and one bandwidth per link of the ring")
    exposed = min(gradients, threshold)
    slowest = max(
        lat + exposed / (workers * bw) for lat, bw in zip(latency, bandwidth, strict=True)
    )
    return t_seq / workers + 2 * (workers - 1) * slowest


def gpipe_compute(t_seq: float, workers: int, microbatches: int) -> float:
    """The recommender study's eq. 6.1: T_comp = T_seq (W + #mb - 1) / (W #mb). W - 1 steps fill and
    drain the pipeline, #mb - W + 1 run every worker at once; with one micro-batch it is
    T_seq (model parallelism, no concurrency)."""
    return t_seq * (workers + microbatches - 1) / (workers * microbatches)


def gpipe_communication(
    workers: int,
    microbatches: int,
    micro_batch: float,
    activations: Sequence[float],
    latency: Sequence[float],
    bandwidth: Sequence[float],
) -> float:
    """The recommender study's eq. 6.2, as written: with x_j = L_j,j+1 + mb A_j / BW_j,j+1
    the time of link j (1..W-1; A_j the MB of activations per sample leaving partition j), the
    lockstep sum of `lockstep_links` over those x_j."""
    if not (len(activations) == len(latency) == len(bandwidth) == workers - 1):
        raise ValueError("eq. 6.2 needs one activation size, latency and bandwidth per link")
    x = [
        lat + micro_batch * a / bw
        for a, lat, bw in zip(activations, latency, bandwidth, strict=True)
    ]
    return lockstep_links(x, microbatches)


def lockstep_links(link_times: Sequence[float], microbatches: int) -> float:
    """Eq. 6.2's sum over the W - 1 links' times x_j:
    2 (sum_{i=1}^{W-2} max_{j<=i} x_j + (#mb - (W - 2)) max_j x_j
    + sum_{i=2}^{W-1} max_{j>=i} x_j). The workers move in lockstep, so each step waits for
    the slowest link active in it; forward and backward send as much, hence the 2."""
    x = list(link_times)
    workers = len(x) + 1
    filling = sum(max(x[:i]) for i in range(1, workers - 1))
    full = (microbatches - (workers - 2)) * max(x)
    draining = sum(max(x[i - 1 :]) for i in range(2, workers))
    return 2 * (filling + full + draining)


def fill_drain(stage_times: Sequence[float], microbatches: int) -> float:
    """(m + K - 1) x the slowest stage: GPipe's step on K stages without transfers."""
    return (microbatches + len(stage_times) - 1) * max(stage_times)


def fill_drain_with_comm(
    stage_times: Sequence[float], transfers: Sequence[float], microbatches: int
) -> float:
    """(m + K - 1) x the slowest of (stage compute + its outgoing transfer)."""
    padded = list(transfers) + [0.0] * (len(stage_times) - len(transfers))
    return (microbatches + len(stage_times) - 1) * max(
        t + c for t, c in zip(stage_times, padded, strict=True)
    )
