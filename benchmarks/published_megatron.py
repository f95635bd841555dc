"""Megatron-LM's weak-scaling table, and pipecast's prediction of each row from one GPU's
profiles.

    python -m benchmarks.published_megatron --profiles DIR [--json FILE]

The rows are Table 1 of Narayanan et al., "Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM", SC21 (arXiv 2104.04473): GPT models of 1.7B to 1T
parameters on 32 to 3072 A100s. Copied from the table's text in
SotaroKaneda/MLCarbon, data/megatron_table.csv at commit
69070b28de401b6800d30f435db32996473560e2 (a CSV of Table 1), and checked against a
markdown transcription of the paper's section 5.1 found beside it in the same index of
public sources (the same ten rows, the paragraph above the table, and Eq. 2 and 3); no
number was typed from memory. tests/benchmarks/test_published_megatron.py checks the rows
against themselves: Eq. 2's parameter count from each row's sizes, TFLOP/s x GPUs against
the aggregate, TFLOP/s against the percentage of the A100's 312.

A100s are not measurable here, so the issue (#67) compares the rows through ratios: each
row's TFLOP/s per GPU over the smallest row's (1.7B on 32 GPUs), first the largest (1T on
3072) over the smallest; the absolute figures are printed beside, for what they are (an
H100's prediction against an A100's measurement).

Layouts as the paper states them: TP, PP and GPUs (DP = GPUs / (TP x PP)) and the global
batch from Table 1; the interleaved pipeline schedule (section 5.1: "we use the
interleaved pipeline schedule with the scatter/gather optimization enabled"); activation
recomputation (Eq. 3 counts its extra forward); whole copies of the weights across DP.
Not stated, so assumed (each row's notes say so): micro-batch 1; as virtual stages per
rank the fewest (2 or more) that cut a stage's layers evenly; Adam.

FLOPs are the paper's Eq. 3 per iteration, F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)), so
predicted TFLOP/s per GPU = F / (predicted step time x GPUs), counted as the table counts
them. F takes the profile's width, sequence and vocabulary (the table's, but for a dry
run's tiny ones), the row's layers and batch.

Cluster: `h100-superpod` (values/hardware/presets.py: DGX H100 nodes, a 400 Gb/s rail a
GPU, a non-blocking fat tree), grown to the row's GPUs. The profiles are an H100's, and a
cluster of the same generation keeps compute and links in one machine's balance: Selene's
200 Gb/s a GPU beside the A100's 312 TFLOP/s peak (section 5) is about 1.25 times the
preset's bandwidth for each FLOP/s (400 Gb/s beside the 789 TFLOP/s the H100 probes
measured), a fat tree and a rail a GPU in both; an A100 cluster priced from an H100's
compute would make every link look 2.5 times as slow, beside the compute, as Selene's were.

Given benchmarks/scale.py --dry's profiles (CPU, width 64), it prices the rows from them:
how the script is tested on a CPU.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.published import ratio_lines, write_json
from benchmarks.scale import MEGATRON_SEQ_LEN, MEGATRON_VOCAB, profile_name
from pipecast.errors import PipecastError
from pipecast.planning.recommend.predict import predict
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.hardware.presets import preset
from pipecast.values.profile.types import Profile
from pipecast.values.strategy import Strategy

SOURCE = (
    "Narayanan et al., SC21 (arXiv 2104.04473), Table 1; text from SotaroKaneda/MLCarbon "
    "data/megatron_table.csv @ 69070b28de401b6800d30f435db32996473560e2"
)
CLUSTER = "h100-superpod"
A100_PEAK = 312.0
"""The A100's 16-bit peak, teraFLOP/s (the paper's section 5)."""


@dataclass(frozen=True)
class Row:
    """One row of Table 1, as published."""

    billions: float
    heads: int
    width: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int
    tflops: float
    """Achieved teraFLOP/s per GPU."""
    peak_percent: int
    petaflops: float
    """Achieved aggregate petaFLOP/s."""

    @property
    def shape(self) -> str:
        """benchmarks/scale.py's SHAPES key."""
        return f"gpt{self.billions:g}b"

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    @property
    def virtual(self) -> int:
        """Stages a rank holds (0: no pipeline): the fewest of 2 or more that cut a stage's
        layers evenly (the paper does not say)."""
        if self.pp == 1:
            return 0
        per_stage = self.layers // self.pp
        return next(v for v in range(2, per_stage + 1) if per_stage % v == 0)

    @property
    def label(self) -> str:
        return f"{self.billions:g}B, TP {self.tp} x PP {self.pp} x DP {self.dp}"


ROWS: tuple[Row, ...] = (
    Row(1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 44, 4.4),
    Row(3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 44, 8.8),
    Row(7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 46, 18.2),
    Row(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 43, 34.6),
    Row(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 44, 70.8),
    Row(76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 45, 143.8),
    Row(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 47, 227.1),
    Row(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 50, 297.4),
    Row(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 52, 410.2),
    Row(1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 52, 502.0),
)
"""Table 1's rows, in its order: parameters (billions), attention heads, hidden size,
layers, TP, PP, GPUs, batch size, achieved teraFLOP/s per GPU, percentage of peak,
aggregate petaFLOP/s (sequence 2048 and vocabulary 51200 throughout)."""
ASSUMED = "micro-batch 1, Adam"


def iteration_flops(batch: int, seq: int, layers: int, width: int, vocab: int) -> float:
    """The paper's Eq. 3: FLOPs of one iteration with activation recomputation."""
    h = width
    return 96 * batch * seq * layers * h * h * (1 + seq / (6 * h) + vocab / (16 * layers * h))


def strategy_of(row: Row) -> Strategy:
    """The Strategy `row`'s layout is (the module's docstring)."""
    return Strategy(
        kind="data" if row.pp == 1 else "hybrid",
        stages=row.pp,
        replicas=row.dp,
        schedule="interleaved" if row.pp > 1 else "1f1b",
        virtual=row.virtual,
        microbatches=row.batch // row.dp,
        recompute="all",
        tp=row.tp,
    )


def cluster_for(gpus: int) -> Cluster:
    """`gpus` GPUs as CLUSTER's nodes of 8."""
    base = preset(CLUSTER)
    return replace(base, nodes=max(1, math.ceil(gpus / base.gpus_per_node)))


@dataclass(frozen=True)
class Outcome:
    """A row's predicted TFLOP/s per GPU, or why there is none."""

    row: Row
    predicted: float | None = None
    why_not: str = ""
    notes: tuple[str, ...] = ()

    @property
    def error(self) -> float | None:
        if self.predicted is None:
            return None
        return (self.predicted - self.row.tflops) / self.row.tflops


def why_not(row: Row, profile: Profile | None) -> str:
    """Why `row` cannot be priced from `profile` ('' where it can)."""
    if profile is None:
        return f"no profile of {row.shape} ({profile_name(row.shape, 'eager')})"
    if row.tp > 1 and row.tp not in profile.tensor_parallel:
        return f"the profile has no TP {row.tp} reading"
    return ""


def outcome(row: Row, folder: Path) -> Outcome:
    path = folder / profile_name(row.shape, "eager")
    profile = Profile.load(str(path)) if path.exists() else None
    if why := why_not(row, profile):
        return Outcome(row, why_not=why)
    assert profile is not None
    notes = [f"assumed: {ASSUMED}"]
    if row.virtual:
        notes[0] += f", {row.virtual} stages a rank"
    if profile.tiled:
        notes.append(profile.tiled)
    try:
        pred = predict(
            profile, cluster_for(row.gpus), strategy_of(row), row.batch, optimizer="adam"
        )
    except PipecastError as exc:
        return Outcome(row, why_not=f"pipecast refuses the layout: {exc}")
    if not pred.fits:
        notes.append(f"predicted not to fit: {pred.peak_memory / 2**30:.1f} GiB a GPU")
    w = profile.workload
    seq = int(w.get("seq_len", MEGATRON_SEQ_LEN))
    flops = iteration_flops(
        row.batch, seq, row.layers, int(w["width"]), int(w.get("vocab", MEGATRON_VOCAB))
    )
    return Outcome(row, flops / (pred.step_time * row.gpus) / 1e12, notes=tuple(notes))


def ratios(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """TFLOP/s per GPU of each row over the smallest row's, published and predicted; the
    largest row's first."""
    base = outcomes[0]
    order = [outcomes[-1], *outcomes[1:-1]]
    out = []
    for o in order:
        published = o.row.tflops / base.row.tflops
        predicted = (
            o.predicted / base.predicted
            if o.predicted is not None and base.predicted is not None
            else None
        )
        error = (predicted - published) / published if predicted is not None else None
        name = f"{o.row.billions:g}B / {base.row.billions:g}B"
        out.append({"ratio": name, "published": published, "predicted": predicted, "error": error})
    return out


def report(
    folder: Path, rows: tuple[Row, ...] = ROWS
) -> tuple[list[Outcome], list[dict[str, Any]]]:
    outcomes = [outcome(row, folder) for row in rows]
    return outcomes, ratios(outcomes)


def _text(outcomes: list[Outcome], table: list[dict[str, Any]]) -> str:
    lines = [f"rows: {SOURCE}; cluster: {CLUSTER}, nodes of 8; FLOPs: the paper's Eq. 3", ""]
    lines.append(
        "| row | GPUs | published TFLOP/s a GPU (A100) | predicted (H100 profiles) | notes |"
    )
    lines.append("|---|---:|---:|---:|---|")
    for o in outcomes:
        r = o.row
        got = "" if o.predicted is None else f"{o.predicted:.3g}"
        notes = f"not expressible: {o.why_not}" if o.predicted is None else "; ".join(o.notes)
        lines.append(f"| {r.label} | {r.gpus} | {r.tflops:g} | {got} | {notes} |")
    lines += ratio_lines(table, "ratio of TFLOP/s a GPU")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", required=True, help="benchmarks/scale.py's output folder")
    ap.add_argument("--json", help="also write the rows and ratios here")
    args = ap.parse_args(argv)
    outcomes, table = report(Path(args.profiles))
    print(_text(outcomes, table))
    if args.json:
        write_json(args.json, {"source": SOURCE, "cluster": CLUSTER}, outcomes, table)


if __name__ == "__main__":
    main()
