"""`pipecast probe`: measure this machine's devices and links, or describe another machine."""

from __future__ import annotations

import argparse
import json

from rich.table import Table

from pipecast import jsonio
from pipecast.cli.common import count_arg, output_file
from pipecast.cli.console import console, human_bytes, human_seconds
from pipecast.measuring.probe.probe import ProbeOptions, probe
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.hardware.presets import DESCRIBED_LINKS, describe


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "probe",
        help="measure links, all-reduce bandwidth, matmul rate and memory (or describe a machine)",
        description="Measure point-to-point latency and bandwidth between every pair of "
        "devices, all-reduce bus bandwidth by group size, matmul FLOP/s and memory, and write "
        "a Cluster. With --describe, write a Cluster for a machine you don't have instead.",
    )
    p.add_argument(
        "--devices", type=count_arg("--devices", 1), default=2, help="how many devices to probe"
    )
    p.add_argument("--device", default="cpu", help="cuda (NCCL, one process per GPU) or cpu")
    p.add_argument(
        "--max-bytes",
        type=count_arg("--max-bytes", ProbeOptions.min_bytes),
        default=256 * 2**20,
        help="largest message (bytes)",
    )
    p.add_argument(
        "--repeats",
        type=count_arg("--repeats", 1),
        default=5,
        help="timed repeats of each transfer and collective at each size",
    )
    p.add_argument("--raw", type=output_file, help="also write the raw samples to this JSON file")
    d = p.add_argument_group("describe a machine instead of measuring")
    d.add_argument(
        "--describe",
        action="store_true",
        help="write a cluster of the figures below without measuring (for GPUs not here)",
    )
    d.add_argument("--nodes", type=count_arg("--nodes", 1), default=1, help="machines")
    d.add_argument(
        "--gpus-per-node", type=count_arg("--gpus-per-node", 1), default=4, help="GPUs in each"
    )
    d.add_argument("--memory", default="80GiB", help="memory per GPU")
    for flag, field, about in (
        ("--intra-bw", "intra_bandwidth", "GPU-to-GPU bandwidth in a node"),
        ("--intra-latency", "intra_latency", "GPU-to-GPU latency in a node"),
        ("--inter-bw", "inter_bandwidth", "GPU-to-GPU bandwidth across nodes"),
        ("--inter-latency", "inter_latency", "GPU-to-GPU latency across nodes"),
    ):
        d.add_argument(flag, default=DESCRIBED_LINKS[field], help=about)
    p.add_argument("-o", "--output", type=output_file, help="where to write the Cluster JSON")
    p.set_defaults(func=run)


def print_cluster(cluster: Cluster) -> None:
    table = Table(
        title=f"{cluster.name}: {cluster.world} x {cluster.device}, "
        f"{human_bytes(cluster.memory_bytes)} each"
    )
    for col in ("link", "latency", "bandwidth"):
        table.add_column(col, justify="left" if col == "link" else "right")
    rows = [("intra-node", cluster.intra), ("inter-node", cluster.inter)]
    rows += [(f"{a} -> {b}", link) for (a, b), link in sorted(cluster.pairs.items())]
    for label, link in rows:
        table.add_row(label, human_seconds(link.latency), f"{link.bandwidth / 1e9:.1f} GB/s")
    for n, bw in sorted(cluster.allreduce_busbw.items()):
        table.add_row(f"all-reduce x{n}", "", f"{bw / 1e9:.1f} GB/s bus")
    if cluster.matmul_flops:
        table.add_row("matmul", "", f"{cluster.matmul_flops / 1e12:.1f} TFLOP/s")
    if cluster.host_overhead:
        table.add_row("runtime host work per action", human_seconds(cluster.host_overhead), "")
    if cluster.step_overhead:
        table.add_row("runtime fixed cost per step", human_seconds(cluster.step_overhead), "")
    for n, factor in sorted(cluster.host_contention.items()):
        table.add_row(f"host with {n} ranks busy", f"{factor:.2f}x slower", "")
    for n, seconds in sorted(cluster.host_issue.items()):
        table.add_row(f"tiny model issued, {n} rank(s) busy", human_seconds(seconds), "")
    console.print(table)


def run(args: argparse.Namespace) -> int:
    if args.describe:
        cluster = describe(
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            memory=args.memory,
            intra_bandwidth=args.intra_bw,
            intra_latency=args.intra_latency,
            inter_bandwidth=args.inter_bw,
            inter_latency=args.inter_latency,
        )
    else:
        with console.status(f"probing {args.devices} x {args.device}"):
            options = ProbeOptions(
                devices=args.devices,
                device=args.device,
                max_bytes=args.max_bytes,
                repeats=args.repeats,
            )
            result = probe(options)
        cluster = result.cluster
        if args.raw:
            jsonio.write_atomic(args.raw, json.dumps(result.to_dict(), indent=1))
    print_cluster(cluster)
    if args.output:
        cluster.save(args.output)
        console.print(f"cluster written to {args.output}")
    return 0
