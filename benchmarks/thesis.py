"""The thesis's recommendation cells (seeds/004, Tables 3.3, 8.1 and 8.2) on the GPUs at hand.

Each cell is a model of its benchmark suite on one of its data sets, and asks one question:
on these GPUs, is Horovod (data parallelism; DDP here) or GPipe faster per sample, each at
the thesis's own batch configuration (Table 3.3)? A cell runs DDP, pipecast's GPipe on its
balanced split, and torchgpipe (the thesis's GPipe, balanced by time, its default
recomputation), and predicts the first two with pipecast's simulator and with the thesis's
equations 5.1 and 6.1 + 6.2 (`equations`), so both models' errors land on the same
measurements.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pipecast.orchestration.bench.accuracy_suite import balanced_split
from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.store import Row
from pipecast.planning.simulation import closed_form
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.models.workload import Workload
from pipecast.values.profile.types import Profile

MODELS = ("resnet18", "resnet50", "resnet152", "vgg11", "vgg16", "mobilenetv2")
DATASETS = ("cifar10", "imagenet", "highres", "mnist")
"""The order cells run in: CIFAR-10, where the thesis's picks were wrong most (1 of 6
right), then the two it got all right, then MNIST."""

BATCHES = {
    "mnist": (128, 3072, 24),
    "cifar10": (64, 2048, 32),
    "imagenet": (32, 384, 12),
    "highres": (32, 48, 12),
}
"""seeds/004, Table 3.3: Horovod's batch per worker, GPipe's batch and its micro-batches."""

_H, _G = "Horovod", "GPipe"
TABLE_8_1 = {
    # (model, data set): (the thesis's recommendation, its measured fastest), seeds/004
    **{(m, "imagenet"): (_H, _H) for m in MODELS},
    **{(m, "highres"): (_H, _H) for m in MODELS if m != "resnet152"},
    ("resnet152", "highres"): (_G, _G),
    **{(m, "cifar10"): (_G, _H) for m in MODELS if m != "mobilenetv2"},
    ("mobilenetv2", "cifar10"): (_H, _H),
    **{(m, "mnist"): (_H, _H) for m in ("resnet50", "resnet152", "mobilenetv2")},
    **{(m, "mnist"): (_G, _H) for m in ("resnet18", "vgg11", "vgg16")},
}

HOROVOD_FUSION_MB = 64.0
"""th of eq. 5.1: Horovod's default tensor-fusion threshold."""


def cells(dry: bool = False) -> list[tuple[str, str]]:
    if dry:
        return [("resnet18", "cifar10"), ("mobilenetv2", "mnist")]
    return [(m, d) for d in DATASETS for m in MODELS]


def batches(dataset: str, gpus: int, dry: bool = False) -> tuple[int, int, int]:
    """(DDP's whole batch, GPipe's batch, GPipe's micro-batches) for `gpus` GPUs."""
    share, gbatch, m = (4, 16, 4) if dry else BATCHES[dataset]
    return share * gpus, gbatch, m


def workloads(gpus: int, dry: bool = False) -> list[tuple[Workload, tuple[int, ...]]]:
    """Each cell's workload and the micro-batch sizes its predictions need."""
    out = []
    for model, dataset in cells(dry):
        ddp, gbatch, m = batches(dataset, gpus, dry)
        sizes = tuple(sorted({ddp // gpus, gbatch // m}))
        out.append((Workload(model=model, dataset=dataset), sizes))
    return out


def configurations(
    profiles: dict[str, Profile], cluster: Cluster, gpus: int, *, dry: bool = False
) -> list[BenchConfig]:
    out = []
    for model, dataset in cells(dry):
        w = Workload(model=model, dataset=dataset)
        ddp_batch, gbatch, m = batches(dataset, gpus, dry)
        tags = {"study": "thesis", "cell": f"{model}/{dataset}"}
        base = BenchConfig(
            suite="thesis", system="ddp", workload=w, gpus=gpus, batch=ddp_batch, tags=tags,
            steps=2 if dry else 4, warmup=1 if dry else 2,
        )  # fmt: skip
        gp = replace(base, system="pipecast", batch=gbatch, schedule="gpipe", microbatches=m,
                     boundaries=balanced_split(profiles[w.key], cluster, gpus, gbatch // m, m,
                                               "gpipe"))  # fmt: skip
        tg = replace(gp, system="torchgpipe", boundaries=(), balance="time",
                     recompute="all-but-last")  # fmt: skip
        out += [base, gp, tg]
    if dry:
        return [replace(c, device="cpu", dtype="fp32") for c in out]
    return out


def equations(cfg: BenchConfig, profile: Profile, cluster: Cluster) -> float | None:
    """The thesis's own prediction of a cell's step time: eq. 5.1 for DDP, eq. 6.1 + 6.2
    for GPipe, from the same profile and probe as the simulator's. T_seq is one GPU's
    forward and backward over the samples one worker (Horovod) or the whole pipeline
    (GPipe, micro-batch by micro-batch) processes; G is the gradients' bytes."""
    w = cfg.gpus
    ring = [cluster.link(i, (i + 1) % w) for i in range(w)]
    mb = 1e6
    if cfg.system == "ddp":
        share = cfg.batch // w
        one = profile.stage(0, profile.num_blocks, share)
        t_seq = w * (one.forward + one.backward)
        return closed_form.horovod(
            t_seq, w, [r.latency for r in ring], [r.bandwidth / mb for r in ring],
            gradients=profile.param_bytes / mb, threshold=HOROVOD_FUSION_MB,
        )  # fmt: skip
    if cfg.system != "pipecast" or cfg.schedule != "gpipe" or len(cfg.boundaries) != w + 1:
        return None
    size = cfg.batch // cfg.microbatches
    whole = profile.stage(0, profile.num_blocks, size)
    t_seq = cfg.microbatches * (whole.forward + whole.backward)
    per_sample = [profile.cost(b - 1, size).output_bytes / size / mb for b in cfg.boundaries[1:-1]]
    links = ring[: w - 1]
    comm = closed_form.gpipe_communication(
        w, cfg.microbatches, size, per_sample,
        [r.latency for r in links], [r.bandwidth / mb for r in links],
    )  # fmt: skip
    return closed_form.gpipe_compute(t_seq, w, cfg.microbatches) + comm


@dataclass(frozen=True)
class Cell:
    """One cell of the thesis's table, as measured and predicted here."""

    model: str
    dataset: str
    measured: dict[str, float]
    """System ('ddp', 'pipecast', 'torchgpipe') -> samples per second measured."""
    predicted: dict[str, float]
    """'ddp' and 'pipecast' -> samples per second the simulator predicts."""
    thesis_predicted: dict[str, float]
    """'ddp' and 'pipecast' -> samples per second the thesis's equations predict."""

    def _winner(self, speeds: dict[str, float]) -> str | None:
        both = {k: speeds[k] for k in ("ddp", "pipecast") if k in speeds}
        if len(both) < 2:
            return None
        return _H if both["ddp"] >= both["pipecast"] else _G

    @property
    def fastest(self) -> str | None:
        """Horovod (DDP) or GPipe (pipecast's), whichever measured more samples/s."""
        return self._winner(self.measured)

    @property
    def pick(self) -> str | None:
        """What pipecast recommends between the two, from its predictions."""
        return self._winner(self.predicted)

    @property
    def thesis_pick(self) -> str | None:
        """What the thesis's equations pick on these GPUs."""
        return self._winner(self.thesis_predicted)

    @property
    def torchgpipe_fastest(self) -> str | None:
        """The thesis's own question here: Horovod (DDP) against torchgpipe."""
        if "ddp" not in self.measured or "torchgpipe" not in self.measured:
            return None
        return _H if self.measured["ddp"] >= self.measured["torchgpipe"] else _G


def cells_of(rows: list[Row]) -> list[Cell]:
    """The thesis cells a store holds, in the order they ran."""
    found: dict[str, dict[str, dict[str, float]]] = {}
    for r in rows:
        cfg = BenchConfig.from_dict(r.config)
        cell = cfg.tags.get("cell")
        if cfg.suite != "thesis" or not cell:
            continue
        d = found.setdefault(cell, {"measured": {}, "predicted": {}, "thesis": {}})
        if r.status == "ok" and r.measured:
            d["measured"][cfg.system] = cfg.batch / r.measured["step_time"]
        pred: dict[str, Any] = r.predicted or {}
        if pred.get("step_time"):
            d["predicted"][cfg.system] = cfg.batch / pred["step_time"]
        if pred.get("thesis_step_time"):
            d["thesis"][cfg.system] = cfg.batch / pred["thesis_step_time"]
    out = []
    for cell, d in found.items():
        model, dataset = cell.split("/")
        out.append(Cell(model, dataset, d["measured"], d["predicted"], d["thesis"]))
    return out
