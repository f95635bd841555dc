"""Profiles of Llama 3.1 8B, 70B and 405B and of Megatron-LM's GPT models from two layers
each, for the scale report.

    python -m benchmarks.scale --out DIR [--budget 450] [--runs 8b-eager,...] [--dry]

In a device call, from the repository's root: `PYTHONPATH=$PWD/src:$PWD python -m
benchmarks.scale --out $OUT` (the runs start `python -m benchmarks.scale` themselves).

One GPU, one device call: each run profiles the model built at 2 layers (embedding, two
decoder layers, norm and head) at torchtitan's sequence of 8192 tokens in bf16, and tiles the
second layer to the model's depth (values/profile/tile.py), as `pipecast profile
--measure-layers 2` does; 70B and 405B also time each layer as one of 8 tensor-parallel ranks
computes it (ProfileOptions.tensor_parallel), for torchtitan's TP 8 rows. Every run is a
process of its own (a fresh allocator; an out-of-memory run does not take the others down)
and writes DIR/llama-<shape>_<execution>.json as it completes; a run that fails at its
micro-batch sizes is tried again at 1 alone, and a run that would start past the budget is
skipped, so a call always returns what it measured. DIR/runs.jsonl has one line a run.

After the Llama runs come Megatron-LM's weak-scaling GPT models (Narayanan et al., SC21,
Table 1: benchmarks/published_megatron.py), `gpt<billions>b-eager`: the zoo's gpt (GPT-2
blocks: learned positions, LayerNorm, a 4 x width GELU MLP, biases) at the table's width,
heads and layers, sequence 2048 and vocabulary 51200, in bf16 at micro-batch 1 (the table
states none), each also as one of its tensor-parallel ranks computes it where the table
splits it. The two largest (529.6B and 1T: 40 and 63 GB of weights and gradients at two
layers) are too large to profile whole on one 80 GB GPU: only a rank's share of their
layers is measured, and it stands for the whole layers too (Profile.tiled says so), which
prices them at their table's TP 8 alone. The smallest and the largest come first, for the
table's ratio from one to the other.

`--dry` runs the same suite on the CPU at a tiny width (64) and sequence (64) with the real
depths: how the suite and the reports that read it (benchmarks/published.py,
benchmarks/published_megatron.py) are tested.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

SEQ_LEN = 8192
"""torchtitan's llama3 training sequence."""
VOCAB = 128256
MEASURED_LAYERS = 2


@dataclass(frozen=True)
class Shape:
    """A model's sizes: a Llama 3.1's (Meta's model card; torchtitan's llama3 configs) or a
    Megatron-LM GPT's (`model` 'gpt': no kv_heads or ffn, the zoo's 4 x width MLP)."""

    width: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    sizes: tuple[int, ...]
    """Micro-batch sizes to profile (what fits one 80 GB GPU at 2 layers)."""
    tp: tuple[int, ...] = ()
    """Tensor-parallel degrees to time a rank's share at."""
    model: str = "llama"
    seq_len: int = SEQ_LEN
    vocab: int = VOCAB
    whole: bool = True
    """Whether the whole layers are profiled (False: a rank's share at `tp` stands for them,
    for a model whose two layers do not fit one GPU)."""


MEGATRON_SEQ_LEN = 2048
MEGATRON_VOCAB = 51200
"""Megatron-LM's Table 1 models' sequence and vocabulary (its section 5.1)."""


def _gpt(width: int, layers: int, heads: int, tp: int, *, whole: bool = True) -> Shape:
    return Shape(
        width,
        layers,
        heads,
        0,
        0,
        sizes=(1,),
        tp=(tp,) if tp > 1 else (),
        model="gpt",
        seq_len=MEGATRON_SEQ_LEN,
        vocab=MEGATRON_VOCAB,
        whole=whole,
    )


SHAPES = {
    "8b": Shape(4096, 32, 32, 8, 14336, sizes=(1, 2)),
    "70b": Shape(8192, 80, 64, 8, 28672, sizes=(1, 2), tp=(8,)),
    # two whole 405B layers, compiled with Float8, pass an 80 GB card at micro-batch 1:
    # its rows are all TP 8, and a rank's share stands for them
    "405b": Shape(16384, 126, 128, 8, 53248, sizes=(1,), tp=(8,), whole=False),
    # Megatron-LM's Table 1 (benchmarks/published_megatron.py): width, layers, heads, TP
    "gpt1.7b": _gpt(2304, 24, 24, 1),
    "gpt3.6b": _gpt(3072, 30, 32, 2),
    "gpt7.5b": _gpt(4096, 36, 32, 4),
    "gpt18.4b": _gpt(6144, 40, 48, 8),
    "gpt39.1b": _gpt(8192, 48, 64, 8),
    "gpt76.1b": _gpt(10240, 60, 80, 8),
    "gpt145.6b": _gpt(12288, 80, 96, 8),
    "gpt310.1b": _gpt(16384, 96, 128, 8),
    "gpt529.6b": _gpt(20480, 105, 128, 8, whole=False),
    "gpt1008b": _gpt(25600, 128, 160, 8, whole=False),
}
DRY = {"width": 64, "heads": 16, "kv_heads": 8, "ffn": 128, "vocab": 256, "seq_len": 64}
"""The dry run's sizes: the real depths, a width a CPU profiles in seconds (a GPT takes
its width, heads, vocabulary and sequence)."""

EXECUTIONS = {
    "eager": {"compile": "off", "float8": False},
    "compiled": {"compile": "blocks", "float8": False},
    "compiled-float8": {"compile": "blocks", "float8": True},
}
"""How the blocks run: Profile's compiled and float8, as a Strategy's execution names them."""

GPT_RUNS = tuple(
    dict.fromkeys(
        f"{shape}-eager"
        for shape in ("gpt1.7b", "gpt1008b", *(k for k in SHAPES if SHAPES[k].model == "gpt"))
    )
)
"""Megatron-LM's GPT models, the smallest and the largest first (Table 1's ratio)."""
RUNS = (
    "8b-eager",
    "8b-compiled",
    "8b-compiled-float8",
    "70b-compiled-float8",
    "405b-compiled-float8",
    "70b-eager",
    "405b-eager",
    "70b-compiled",
    "405b-compiled",
    *GPT_RUNS,
)
"""In the order they run: torchtitan's 8B rows and their ratios first, then the execution
torchtitan's 70B and 405B rows ran (compiled, Float8), then the rest of the Llama runs;
then Megatron-LM's GPT models, eager (as Megatron ran them, uncompiled, in bf16), the
smallest and the largest first."""

DRY_RUNS = ("8b-eager", "70b-eager", "405b-eager", *GPT_RUNS)
"""The CPU's dry run: eager alone (inductor on a CPU takes minutes, Float8 needs an H100)."""


def profile_name(shape: str, execution: str) -> str:
    """llama-<shape>_<execution>.json; a GPT's gpt<billions>b_<execution>.json."""
    prefix = "llama-" if SHAPES[shape].model == "llama" else ""
    return f"{prefix}{shape}_{execution}.json"


def workload_of(shape: str, *, dry: bool) -> dict[str, Any]:
    """The Workload's fields for `shape` (its real sizes, or the dry run's at its depth)."""
    s = SHAPES[shape]
    sizes = {"width": s.width, "heads": s.heads, "vocab": s.vocab, "seq_len": s.seq_len}
    if s.model == "llama":
        sizes |= {"kv_heads": s.kv_heads, "ffn": s.ffn}
    if dry:
        sizes |= {k: v for k, v in DRY.items() if k in sizes}
    return {"model": s.model, "dataset": "tokens", "layers": s.layers, **sizes}


@dataclass(frozen=True)
class Job:
    """One profile to take, as the child process reads it."""

    shape: str
    execution: str
    sizes: tuple[int, ...]
    dry: bool
    out: str

    @property
    def path(self) -> Path:
        return Path(self.out) / profile_name(self.shape, self.execution)


def _profile(job: Job) -> dict[str, Any]:
    """In the child: profile the model at MEASURED_LAYERS layers, then (where the shape
    takes TP readings) a fresh tensor-parallel rank's share of it, tile both, save them. A
    shape not profiled whole (Shape.whole) takes its rank's share for its whole blocks."""
    import torch

    from pipecast.measuring.profiler.profiler import ProfileOptions, profile_model
    from pipecast.measuring.profiler.tensor_parallel import sharded_model, with_tensor_parallel
    from pipecast.values.models.workload import Workload
    from pipecast.values.profile.tile import layer_repeat, tiled

    shape = SHAPES[job.shape]
    workload = Workload(**workload_of(job.shape, dry=job.dry))
    measured = replace(workload, layers=MEASURED_LAYERS)
    device = "cpu" if job.dry else "cuda"
    options = ProfileOptions(
        micro_batch_sizes=job.sizes,
        device=device,
        dtype="fp32" if job.dry else "bf16",
        graph_times=False,  # no --cuda-graphs row to predict; a graph of 405B's layer is GBs
        repeats=3 if job.dry else 5,
        **EXECUTIONS[job.execution],  # type: ignore[arg-type]
    )
    began = time.perf_counter()

    def profiled(model: Any) -> Any:
        return profile_model(
            _built(model, device),
            workload.spec,
            options,
            model_name=shape.model,
            workload=measured.to_dict(),
        )

    profile = profiled(measured.build("meta")) if shape.whole else None
    for degree in shape.tp:  # a rank's share, built afresh: nothing compiled,
        # converted to Float8 or held from the whole model's profile carries over
        _free(device)
        rank = profiled(sharded_model(measured.build("meta"), degree))
        profile = with_tensor_parallel(profile or rank, rank, measured.build("meta"), degree)
    assert profile is not None, f"{job.shape}: profiled neither whole nor in shares"
    profile = tiled(profile, MEASURED_LAYERS, workload.layers, layer_repeat(workload))
    if not shape.whole:
        shares = f"one of {shape.tp[0]} tensor-parallel ranks' shares stands for the whole"
        profile = replace(
            profile,
            tiled=f"{profile.tiled}; {shares} layers (not measured)",
            shares=shape.tp[0],
        )
    job.path.parent.mkdir(parents=True, exist_ok=True)
    profile.save(job.path)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    return {"seconds": round(time.perf_counter() - began, 1), "peak_bytes": peak}


def _built(model: Any, device: str) -> Any:
    """`model`, built shapes only, given memory on `device` in the precision it is profiled
    at (bf16 on a GPU: no fp32 copy on the host, 42 GB for 405B's 2 layers) and weights of
    a trained model's scale: norms 1, the rest N(0, 0.02) (values change no timing, but
    Float8's scales read them)."""
    import torch

    if device != "cpu":
        model.to(torch.bfloat16)  # on the meta device: free
    model.to_empty(device=device)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    return model


def _free(device: str) -> None:
    import gc

    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _run(job: Job, timeout: float) -> dict[str, Any]:
    """`job` in a process of its own: its result line, or why it failed."""
    cmd = [sys.executable, "-m", "benchmarks.scale", "--child", json.dumps(asdict(job))]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "why": f"past {timeout:.0f} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode == 0 and lines:
        return {"ok": True, **json.loads(lines[-1])}
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return {"ok": False, "why": " | ".join(tail)[-600:]}


def run_suite(out: Path, runs: list[str], *, budget: float, dry: bool) -> list[dict[str, Any]]:
    """Each run of `runs` in order within `budget` seconds; one line each in out/runs.jsonl."""
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    rows = []
    for name in runs:
        shape, _, execution = name.partition("-")
        sizes = SHAPES[shape].sizes
        attempts = [sizes] if sizes == (1,) else [sizes, (1,)]
        row: dict[str, Any] = {"run": name, "ok": False, "why": "skipped: past the budget"}
        for attempt in attempts:
            left = budget - (time.monotonic() - began)
            if left < 20:
                break
            job = Job(shape, execution, attempt, dry, str(out))
            row = {"run": name, "sizes": list(attempt), **_run(job, left)}
            if row["ok"]:
                row["profile"] = job.path.name
                break
        rows.append(row)
        with open(out / "runs.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "scale-profiles"))
    ap.add_argument("--budget", type=float, default=450.0, help="seconds for all the runs")
    ap.add_argument("--runs", default="", help=f"comma-separated, of {', '.join(RUNS)}")
    ap.add_argument("--dry", action="store_true", help="CPU, tiny width: test the suite")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        job = Job(**{**json.loads(args.child), "sizes": tuple(json.loads(args.child)["sizes"])})
        print(json.dumps(_profile(job)), flush=True)
        return
    runs = [r for r in args.runs.split(",") if r] or list(DRY_RUNS if args.dry else RUNS)
    unknown = [r for r in runs if r not in RUNS]
    if unknown:
        ap.error(f"unknown runs {unknown}: choose from {', '.join(RUNS)}")
    rows = run_suite(Path(args.out), runs, budget=args.budget, dry=args.dry)
    done = sum(r["ok"] for r in rows)
    print(f"{done} of {len(rows)} profiles written to {args.out}")


if __name__ == "__main__":
    main()
