"""The recommender's accuracy suite: configurations whose step time and memory pipecast
predicts, measured on the GPUs at hand, from profiles and a probe taken first.

Seven workloads (the anchors' GPT and VGG-16, ResNet-50, VGG-16 on CIFAR-10 shapes, and the
recommender study's ResNet-18, ResNet-152 and MobileNetV2) over one GPU, data parallelism, pipelines
of 1F1B, ZB-H1 and GPipe, and a hybrid; pipeline splits are pipecast's own balanced ones. The
GPipe study's splits x micro-batches ride along (suite 'seeds'). A dry run shrinks every
workload to run on CPU ranks in minutes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipecast.orchestration.bench.config import BenchConfig
from pipecast.orchestration.bench.suites import GPT, VGG16, anchors, gpipe_study
from pipecast.planning.partition import Setting, partition
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.models.workload import Workload
from pipecast.values.profile.types import Profile


@dataclass(frozen=True)
class Profiled:
    """A workload the suite profiles, and at which micro-batch sizes."""

    name: str
    workload: Workload
    sizes: tuple[int, ...]


def workloads(dry: bool = False) -> list[Profiled]:
    if dry:
        tiny_gpt = Workload(
            model="transformer", dataset="embeddings", seq_len=16, width=32, layers=8, heads=4
        )
        return [
            Profiled("vgg16", Workload(model="vgg11", dataset="cifar10"), (2, 4)),
            Profiled("gpt", tiny_gpt, (1, 2)),
            Profiled("resnet50", Workload(model="resnet18", dataset="cifar10"), (2, 4, 8)),
            Profiled("vgg16_cifar", Workload(model="lenet5", dataset="mnist"), (2, 8)),
            Profiled("mobilenetv2", Workload(model="mobilenetv2", dataset="cifar10"), (4, 8)),
        ]
    studied = [
        Profiled(m, Workload(model=m, dataset="imagenet"), (32, 64, 128))
        for m in ("resnet18", "resnet152", "mobilenetv2")
    ]
    return [
        Profiled("vgg16", VGG16, (4, 8, 16, 32, 64, 128)),
        Profiled("gpt", GPT, (1, 2, 4, 8)),
        Profiled("resnet50", Workload(model="resnet50", dataset="imagenet"), (16, 32, 64, 128)),
        Profiled("vgg16_cifar", Workload(model="vgg16", dataset="cifar10"), (4, 8, 32, 128)),
        *studied,
    ]


def balanced_split(
    prof: Profile, cluster: Cluster, stages: int, size: int, m: int, schedule: str = "1f1b"
) -> tuple[int, ...]:
    """pipecast's balanced split into `stages` for `m` micro-batches of `size` (planned on
    this machine's kind of GPU even where the configuration needs more of them than it
    has: such configurations are planned, then dropped)."""
    setting = Setting(micro_batch=size, microbatches=m, schedule=schedule, memory_margin=0.1)
    plan = replace(cluster, gpus_per_node=max(cluster.gpus_per_node, stages))
    return tuple(partition(prof, plan, stages, setting, "balanced").boundaries)


def configurations(
    profiles: dict[str, Profile], cluster: Cluster, gpus: int, *, dry: bool = False
) -> list[BenchConfig]:
    """The suite for `gpus` GPUs (at most 4 wide), most important first: every
    configuration needing more GPUs than that is left out."""
    by_name = {p.name: p.workload for p in workloads(dry)}
    prof = {name: profiles[w.key] for name, w in by_name.items()}
    vgg, gpt, r50, vggc = (by_name[n] for n in ("vgg16", "gpt", "resnet50", "vgg16_cifar"))
    studied = [
        w for n, w in by_name.items() if n not in ("vgg16", "gpt", "resnet50", "vgg16_cifar")
    ]
    gb, vb, rb, wide = (16, 16, 16, 2) if dry else (32, 128, 128, min(4, gpus))
    if dry:
        anchor = anchors(
            (0, 4, 8), (0, 2, 4, 6, 8), (0, 15, 30), None,
            gpus=2, gpt=gpt, vgg=vgg, gpt_batch=gb, vgg_batch=vb,
        )  # fmt: skip
    else:
        anchor = anchors(vgg_pipecast=balanced_split(prof["vgg16"], cluster, 4, 16, 8))
    extra: list[BenchConfig] = []
    base = BenchConfig(suite="accuracy", system="single", workload=r50, gpus=1, batch=rb)
    pipe = replace(base, system="pipecast", tags={"split": "pipecast"})
    for k in (2, wide):
        extra.append(replace(base, system="ddp", gpus=k))
        for schedule, m in (("1f1b", k), ("1f1b", 2 * k), ("zb-h1", 2 * k)):
            split = balanced_split(prof["resnet50"], cluster, k, rb // m, m)
            extra.append(replace(pipe, gpus=k, schedule=schedule, microbatches=m, boundaries=split))
    half = balanced_split(prof["resnet50"], cluster, wide // 2, rb // 4, 2)
    extra.append(replace(pipe, gpus=wide, replicas=2, microbatches=2, boundaries=half))
    g2 = BenchConfig(suite="accuracy", system="ddp", workload=gpt, gpus=2, batch=gb)
    gsplit = (0, prof["gpt"].num_blocks // 2, prof["gpt"].num_blocks)
    extra += [
        g2,
        replace(g2, system="pipecast", schedule="1f1b", microbatches=8, boundaries=gsplit),
        replace(g2, system="pipecast", schedule="zb-h1", microbatches=8, boundaries=gsplit),
    ]
    v2 = BenchConfig(suite="accuracy", system="ddp", workload=vgg, gpus=2, batch=vb)
    vsplit = balanced_split(prof["vgg16"], cluster, 2, vb // 8, 8)
    extra += [v2, replace(v2, system="pipecast", microbatches=8, boundaries=vsplit), base]
    splits = {
        1: (0, prof["vgg16_cifar"].num_blocks),
        2: balanced_split(prof["vgg16_cifar"], cluster, 2, 16, 8),
        wide: balanced_split(prof["vgg16_cifar"], cluster, wide, 16, 8),
    }
    seeds = gpipe_study(
        vggc, splits, 16 if dry else 128, microbatches=(1, 4) if dry else (1, 4, 16, 32)
    )
    for w in studied:
        t = BenchConfig(
            suite="seeds", system="single", workload=w, gpus=1, batch=16 if dry else 128,
            tags={"study": "recommender"},
        )  # fmt: skip
        split = balanced_split(profiles[w.key], cluster, wide, 4 if dry else 32, 4)
        seeds += [
            replace(t, system="ddp", gpus=wide),
            replace(t, system="pipecast", gpus=wide, microbatches=4, boundaries=split),
            t,
        ]
    ordered = [c for c in anchor if c.gpus > 1] + [c for c in extra + seeds if c.gpus == wide]
    ordered += [c for c in extra + seeds if c.gpus == 2]
    ordered += [c for c in anchor + extra + seeds if c.gpus == 1]
    # torch.distributed.pipelining's rows have no predictions: the anchors compare them
    configs = list({c.key: c for c in ordered if c.gpus <= gpus and c.system != "torch"}.values())
    if dry:
        return [replace(c, device="cpu", dtype="fp32", steps=2, warmup=1) for c in configs]
    return [replace(c, steps=10, warmup=3) for c in configs]  # small steps vary: 10 of them
