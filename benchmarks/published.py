"""Published large-scale Llama runs, and pipecast's prediction of each from one GPU's profiles.

    python -m benchmarks.published --profiles DIR [--dry] [--json FILE]

The rows are torchtitan's, `benchmarks/llama3_h100_202412_torchtitan.md` in pytorch/torchtitan
(Tables 1-6; versions of 2024/12/23-26): Llama 3.1 8B, 70B and 405B on H100s with 96 GB of
HBM2e at 500 W, 8 a host, NVLink within it and 400 Gb/s of RDMA a GPU. Their GPUs are not the
lent H100 SXMs, so the issue (#67) compares them through ratios between rows (compiled over
eager, Float8 over bf16, interleaved over 1F1B, 128 GPUs over 8); the absolute errors are
printed beside. Megatron-LM's (Narayanan et al., SC21, Table 1) rows are
benchmarks/published_megatron.py's, copied from a stored text of the table.

For each row the script builds the Strategy its layout is (FSDP degree, TP, PP with its
schedule, compiled, Float8, recomputation), takes the profile of the row's shape and
execution from DIR (benchmarks/scale.py's llama-<shape>_<execution>.json), prices it with
pipecast's predict on `h100-nvlink` nodes (values/hardware/presets.py) with torchtitan's
96 GB cards and no memory margin (the runs fitted; the table sets the predicted peak beside
the published one) and prints tokens/s per GPU beside the published figure. A row
pipecast cannot express is listed with why; one it expresses only in part is predicted and
its note says what was left out. `--dry`
prices every execution from the eager profile (benchmarks/scale.py --dry makes only those):
how the script is tested on a CPU.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal, get_args

from benchmarks.scale import SEQ_LEN, profile_name
from pipecast.errors import PipecastError
from pipecast.planning.recommend.predict import predict
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.hardware.presets import preset
from pipecast.values.profile.types import Profile
from pipecast.values.strategy import Strategy
from pipecast.values.training import Recompute

SOURCE = "torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
CLUSTER = "h100-nvlink"
OPTIMIZER: Literal["adam"] = "adam"  # torchtitan's AdamW: two states a weight

Checkpointing = Literal["selective", "full"]


@dataclass(frozen=True, kw_only=True)
class Row:
    """One published run: its layout and its figure."""

    table: str
    label: str
    shape: str
    """'8b', '70b' or '405b' (benchmarks/scale.py's SHAPES)."""
    gpus: int
    seq_len: int
    local_batch: int
    """Sequences a step per data-parallel (FSDP x CP) rank group."""
    fsdp: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    schedule: str = "1f1b"
    microbatches: int = 1
    compiled: bool = False
    float8: bool = False
    async_tp: bool = False
    checkpointing: Checkpointing = "selective"
    tokens_per_gpu: float
    """Published TPS/GPU."""
    memory_gib: float
    assumed: str = ""
    """What the row's layout takes that the source does not state."""
    unexpressible: str = ""
    """Why pipecast cannot price this row, where no general rule finds it."""

    @property
    def execution(self) -> str:
        """The profile that prices it (benchmarks/scale.py's EXECUTIONS)."""
        if not self.compiled:
            return "eager-float8" if self.float8 else "eager"
        return "compiled-float8" if self.float8 else "compiled"

    @property
    def global_batch(self) -> int:
        return self.local_batch * self.fsdp


def _t1(label: str, gpus: int, table: str, tps: float, gib: float, **kw: Any) -> Row:
    return Row(
        table=table,
        label=label,
        shape="8b",
        gpus=gpus,
        seq_len=8192,
        local_batch=2,
        fsdp=gpus,
        tokens_per_gpu=tps,
        memory_gib=gib,
        **kw,
    )


def _cp(shape: str, fsdp: int, cp: int, tps: float, gib: float, **kw: Any) -> Row:
    return Row(
        table="Table 2" if shape == "8b" else "Table 6",
        label=f"{shape.upper()} FSDP {fsdp}, CP {cp}, seq {32768 * cp}",
        shape=shape,
        seq_len=32768 * cp,
        fsdp=fsdp,
        cp=cp,
        compiled=True,
        float8=True,
        checkpointing="full",
        tokens_per_gpu=tps,
        memory_gib=gib,
        **kw,
    )


_PP = {"tp": 8, "pp": 8, "async_tp": True, "gpus": 512}
ROWS: tuple[Row, ...] = (
    _t1("8B FSDP 8", 8, "Table 1", 5762, 82.4),
    _t1("8B FSDP 8, compiled", 8, "Table 1", 6667, 77.0, compiled=True),
    _t1("8B FSDP 8, compiled, Float8", 8, "Table 1", 8532, 76.8, compiled=True, float8=True),
    _cp("8b", 8, 1, 3890, 83.9, gpus=8, local_batch=1),
    _cp("8b", 4, 2, 2540, 84.2, gpus=8, local_batch=1),
    _cp("8b", 2, 4, 1071, 84.0, gpus=8, local_batch=1),
    _cp("8b", 1, 8, 548, 84.5, gpus=8, local_batch=1),
    _t1("8B FSDP 128", 128, "Table 3", 5605, 67.0),
    _t1("8B FSDP 128, compiled", 128, "Table 3", 6514, 62.0, compiled=True),
    _t1("8B FSDP 128, compiled, Float8", 128, "Table 3", 8380, 61.8, compiled=True, float8=True),
    Row(
        table="Table 4",
        label="70B FSDP 32 x TP 8, compiled, Float8",
        shape="70b",
        gpus=256,
        seq_len=8192,
        local_batch=16,
        fsdp=32,
        tp=8,
        compiled=True,
        float8=True,
        checkpointing="full",
        tokens_per_gpu=829,
        memory_gib=71.9,
    ),
    Row(
        table="Table 4",
        label="70B FSDP 32 x TP 8, compiled, Float8, async TP",
        shape="70b",
        gpus=256,
        seq_len=8192,
        local_batch=16,
        fsdp=32,
        tp=8,
        compiled=True,
        float8=True,
        async_tp=True,
        checkpointing="full",
        tokens_per_gpu=876,
        memory_gib=67.6,
        unexpressible="asynchronous TP (its collectives overlapped with the projections) is "
        "this row's point, and pipecast prices TP's all-reduces as torch's plain TP runs them",
    ),
    Row(
        table="Table 5",
        label="405B FSDP 8 x TP 8 x PP 8, 1F1B",
        shape="405b",
        seq_len=8192,
        local_batch=32,
        fsdp=8,
        microbatches=8,
        compiled=True,
        float8=True,
        checkpointing="full",
        tokens_per_gpu=100,
        memory_gib=82.5,
        assumed="8 micro-batches of 4: torchtitan's default of the time, as many micro-batches "
        "as stages (the table does not say)",
        **_PP,  # type: ignore[arg-type]
    ),
    Row(
        table="Table 5",
        label="405B FSDP 8 x TP 8 x PP 8, interleaved 1F1B",
        shape="405b",
        seq_len=8192,
        local_batch=32,
        fsdp=8,
        schedule="interleaved",
        microbatches=16,
        compiled=True,
        float8=True,
        checkpointing="full",
        tokens_per_gpu=128,
        memory_gib=72.7,
        assumed="2 stages a rank and 16 micro-batches of 2: torchtitan's defaults of the time, "
        "as many micro-batches as stages (the table does not say)",
        **_PP,  # type: ignore[arg-type]
    ),
    _cp("405b", 8, 1, 76, 75.3, local_batch=8, microbatches=8, **_PP),
    _cp("405b", 4, 2, 47, 75.9, local_batch=8, microbatches=8, **_PP),
    _cp("405b", 2, 4, 31, 77.1, local_batch=8, microbatches=8, **_PP),
    _cp("405b", 1, 8, 16, 84.9, local_batch=8, microbatches=8, **_PP),
)
"""torchtitan's Tables 1-6, in their order (TPS/GPU and memory as published)."""

RATIOS = (
    ("compiled / eager, 8 GPUs", "8B FSDP 8, compiled", "8B FSDP 8"),
    ("compiled / eager, 128 GPUs", "8B FSDP 128, compiled", "8B FSDP 128"),
    ("Float8 / bf16 compiled, 8 GPUs", "8B FSDP 8, compiled, Float8", "8B FSDP 8, compiled"),
    (
        "Float8 / bf16 compiled, 128 GPUs",
        "8B FSDP 128, compiled, Float8",
        "8B FSDP 128, compiled",
    ),
    ("128 GPUs / 8, eager", "8B FSDP 128", "8B FSDP 8"),
    ("128 GPUs / 8, compiled", "8B FSDP 128, compiled", "8B FSDP 8, compiled"),
    (
        "128 GPUs / 8, compiled, Float8",
        "8B FSDP 128, compiled, Float8",
        "8B FSDP 8, compiled, Float8",
    ),
    (
        "interleaved / 1F1B, 405B",
        "405B FSDP 8 x TP 8 x PP 8, interleaved 1F1B",
        "405B FSDP 8 x TP 8 x PP 8, 1F1B",
    ),
    ("CP 2 / CP 1, 8B", "8B FSDP 4, CP 2, seq 65536", "8B FSDP 8, CP 1, seq 32768"),
)
"""(name, numerator row, denominator row): TPS/GPU ratios within one source."""


@dataclass(frozen=True)
class Outcome:
    """A row's prediction (tokens/s per GPU, the error against the published figure), or
    why there is none; `notes`: what the prediction leaves out or assumes."""

    row: Row
    predicted: float | None = None
    why_not: str = ""
    notes: tuple[str, ...] = ()
    memory_gib: float | None = None

    @property
    def error(self) -> float | None:
        if self.predicted is None:
            return None
        return (self.predicted - self.row.tokens_per_gpu) / self.row.tokens_per_gpu


def strategy_of(row: Row) -> tuple[Strategy, list[str]]:
    """The Strategy `row`'s layout is, and what it approximates."""
    notes = []
    recompute: Recompute = "all" if row.checkpointing == "full" else "none"
    if row.checkpointing == "selective" and "selective" not in get_args(Recompute):
        notes.append("selective activation checkpointing priced as none (pipecast has none)")
    elif row.checkpointing == "selective":
        recompute = "selective"  # type: ignore[assignment]
    if row.async_tp:
        notes.append("async TP priced as plain TP")
    if row.assumed:
        notes.append(f"assumed: {row.assumed}")
    strategy = Strategy(
        kind="hybrid" if row.pp > 1 else "data",
        stages=row.pp,
        replicas=row.fsdp,
        schedule=row.schedule,
        microbatches=row.microbatches,
        shard="full",
        tp=row.tp,
        cp=row.cp,
        recompute=recompute,
        compile="blocks" if row.compiled else "off",
        float8=row.float8,
    )
    return strategy, notes


CARD_MEMORY = 96 * 10**9
"""torchtitan's H100s' memory (96 GB of HBM2e, 89.4 GiB): its 405B rows peaked at up to
84.9 GiB, past an 80 GB card's."""


def cluster_for(gpus: int) -> Cluster:
    """`gpus` H100s as h100-nvlink nodes of 8, with torchtitan's cards' memory."""
    base = preset(CLUSTER)
    nodes = max(1, math.ceil(gpus / base.gpus_per_node))
    return replace(base, nodes=nodes, memory_bytes=CARD_MEMORY)


def why_not(row: Row, profile: Profile | None) -> str:
    """Why `row` cannot be priced from `profile` ('' where it can)."""
    if row.unexpressible:
        return row.unexpressible
    if row.cp > 1 and row.fsdp > 1:  # planning/recommend/context.py: beside whole copies
        return f"context parallelism (CP {row.cp}) beside FSDP {row.fsdp}: pipecast has no price"
    if profile is None:
        return (
            f"no profile of {row.shape} {row.execution} ({profile_name(row.shape, row.execution)})"
        )
    seq = int(profile.workload.get("seq_len", 0))
    if row.seq_len != SEQ_LEN or (row.seq_len != seq and profile.device != "cpu"):
        return f"sequence {row.seq_len}: the profiles are at {seq} (benchmarks/scale.py)"
    if row.tp > 1 and row.tp not in profile.tensor_parallel:
        return f"the profile has no TP {row.tp} reading"
    return ""


def profile_for(row: Row, folder: Path, *, dry: bool) -> tuple[Profile | None, list[str]]:
    """The profile of `row`'s shape and execution in `folder` (with `dry`, the eager one
    stands in for any execution)."""
    path = folder / profile_name(row.shape, row.execution)
    if path.exists():
        return Profile.load(str(path)), []
    eager = folder / profile_name(row.shape, "eager")
    if dry and eager.exists():
        return Profile.load(str(eager)), [f"dry: {row.execution} priced from the eager profile"]
    return None, []


def outcome(row: Row, folder: Path, *, dry: bool = False) -> Outcome:
    profile, notes = profile_for(row, folder, dry=dry)
    if why := why_not(row, profile):
        return Outcome(row, why_not=why)
    assert profile is not None
    strategy, more = strategy_of(row)
    try:
        prediction = predict(  # the run fitted: no margin, its memory beside the published
            profile,
            cluster_for(row.gpus),
            strategy,
            row.global_batch,
            optimizer=OPTIMIZER,
            memory_margin=0.0,
        )
    except PipecastError as exc:
        return Outcome(row, why_not=f"pipecast refuses the layout: {exc}")
    tokens = row.global_batch * int(profile.workload["seq_len"])  # the dry run's is 64
    per_gpu = tokens / prediction.step_time / row.gpus
    if not prediction.fits:
        more.append(
            f"predicted not to fit: {prediction.peak_memory / 2**30:.1f} GiB a GPU, "
            f"{prediction.memory_limit / 2**30:.1f} usable"
        )
    peak = prediction.peak_memory / 2**30
    return Outcome(row, per_gpu, notes=tuple(notes + more), memory_gib=peak)


def ratios(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """Each of RATIOS, published and predicted (None where a row has no prediction)."""
    by_label = {o.row.label: o for o in outcomes}
    out = []
    for name, top, bottom in RATIOS:
        a, b = by_label[top], by_label[bottom]
        published = a.row.tokens_per_gpu / b.row.tokens_per_gpu
        predicted = a.predicted / b.predicted if a.predicted is not None and b.predicted else None
        error = (predicted - published) / published if predicted is not None else None
        out.append({"ratio": name, "published": published, "predicted": predicted, "error": error})
    return out


def report(folder: Path, *, dry: bool = False) -> tuple[list[Outcome], list[dict[str, Any]]]:
    outcomes = [outcome(row, folder, dry=dry) for row in ROWS]
    return outcomes, ratios(outcomes)


def _text(outcomes: list[Outcome], table: list[dict[str, Any]]) -> str:
    lines = [f"rows: {SOURCE}; cluster: {CLUSTER} nodes of 8; optimizer AdamW", ""]
    lines.append(
        "| table | row | GPUs | published TPS/GPU | predicted | error | memory GiB, published "
        "/ predicted | notes |"
    )
    lines.append("|---|---|---:|---:|---:|---:|---:|---|")
    for o in outcomes:
        r = o.row
        if o.predicted is None:
            cells = ["", "", f"{r.memory_gib:.1f}", f"not expressible: {o.why_not}"]
        else:
            assert o.error is not None and o.memory_gib is not None
            memory = f"{r.memory_gib:.1f} / {o.memory_gib:.1f}"
            cells = [f"{o.predicted:,.0f}", f"{o.error:+.1%}", memory, "; ".join(o.notes)]
        lines.append(
            f"| {r.table} | {r.label} | {r.gpus} | {r.tokens_per_gpu:,.0f} | "
            + " | ".join(cells)
            + " |"
        )
    lines += ratio_lines(table, "ratio")
    return "\n".join(lines)


def write_json(
    path: str,
    head: dict[str, Any],
    outcomes: Sequence[Any],
    table: list[dict[str, Any]],
    **extra: str,
) -> None:
    """`head`, then each outcome's row with its prediction, error, why it is not expressible
    and its notes (and each of `extra`'s keys, read from the attribute it names), then the
    ratio checks, as JSON at `path`."""
    rows = [
        {
            **asdict(o.row),
            "predicted": o.predicted,
            "error": o.error,
            "not_expressible": o.why_not,
            "notes": list(o.notes),
            **{key: getattr(o, name) for key, name in extra.items()},
        }
        for o in outcomes
    ]
    doc = {**head, "rows": rows, "ratios": table}
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def ratio_lines(table: list[dict[str, Any]], heading: str) -> list[str]:
    """The ratio checks as a markdown table, after a blank line: each published ratio, its
    prediction and the error."""
    lines = ["", f"| {heading} | published | predicted | error |", "|---|---:|---:|---:|"]
    for t in table:
        if t["predicted"] is None:
            lines.append(f"| {t['ratio']} | {t['published']:.3f} | not predicted | |")
        else:
            cells = [f"{t['published']:.3f}", f"{t['predicted']:.3f}", f"{t['error']:+.1%}"]
            lines.append(f"| {t['ratio']} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", required=True, help="benchmarks/scale.py's output folder")
    ap.add_argument("--dry", action="store_true", help="price every execution from eager")
    ap.add_argument("--json", help="also write the rows and ratios here")
    args = ap.parse_args(argv)
    outcomes, table = report(Path(args.profiles), dry=args.dry)
    print(_text(outcomes, table))
    if args.json:
        head = {"source": SOURCE, "cluster": CLUSTER}
        write_json(args.json, head, outcomes, table, predicted_memory_gib="memory_gib")


if __name__ == "__main__":
    main()
