"""`pipecast profile`: measure every block of a model and save the Profile."""

from __future__ import annotations

import argparse
from dataclasses import replace

from rich.table import Table

from pipecast.cli.common import (
    DTYPE_HELP,
    add_workload_args,
    count_arg,
    note_sizes,
    output_file,
    parse_int_list,
    workload_from_args,
)
from pipecast.cli.console import console, human_bytes, human_count, human_seconds, progress
from pipecast.cli.model_size import check_model_size
from pipecast.errors import ConfigError
from pipecast.measuring.profiler.profiler import ProfileOptions, profile_model
from pipecast.runtime import devices, float8
from pipecast.values.models.summary import block_name
from pipecast.values.models.workload import Workload
from pipecast.values.profile.pool import pool_host, pool_mismatch, poolable
from pipecast.values.profile.tile import layer_repeat, tiled
from pipecast.values.profile.types import Profile


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "profile",
        help="measure each block's forward, backward (B and W), memory and output size",
        description="Profile a model block by block at one or more micro-batch sizes and "
        "write the Profile as JSON, the input of partition, simulate and recommend.",
    )
    add_workload_args(p)
    p.add_argument(
        "--micro-batch-sizes",
        "--micro-batch",
        dest="micro_batch_sizes",
        default="1,2,4,8",
        help="samples per micro-batch to measure at, e.g. 8,16,32",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32", help=DTYPE_HELP)
    p.add_argument("--autocast", action="store_true", help="fp32 parameters, autocast compute")
    p.add_argument(
        "--repeats", type=count_arg("--repeats", 1), default=7, help="timed repeats per measurement"
    )
    p.add_argument(
        "--warmup", type=count_arg("--warmup", 0), default=2, help="untimed warm-up runs"
    )
    p.add_argument("--offload", action="store_true", help="hold one block on the device at a time")
    p.add_argument(
        "--host-windows",
        type=count_arg("--host-windows", 1),
        default=3,
        help="windows of whole-model passes spread over the profile; each size's host costs "
        "are their median (the host's speed moves in spells of seconds)",
    )
    p.add_argument(
        "--hide-issue",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time the device with the host's issuing hidden (CUDA; --no-hide-issue: "
        "device times from plain passes, as profiles before it were taken)",
    )
    p.add_argument(
        "--graph-times",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time each block replayed as CUDA graphs, for predictions of "
        "--cuda-graphs runs (CUDA, without autocast; --no-graph-times: skip them)",
    )
    p.add_argument(
        "--pool-host",
        nargs="+",
        metavar="PROFILE",
        default=[],
        help="earlier profiles of this model, sizes and GPU kind: the written profile's host "
        "costs become the mean over them and this one (one profile reads the host in one of "
        "its spells; device times and memory stay this one's)",
    )
    p.add_argument(
        "--compile",
        choices=("off", "blocks"),
        default="off",
        help="profile the blocks as inductor-compiled code, each block its own graph, its "
        "backward split as zero-bubble stages run it (train --compile blocks)",
    )
    p.add_argument(
        "--channels-last", action="store_true", help="convolutions in channels-last order"
    )
    p.add_argument("--float8", action="store_true", help="Linears in Float8 (H100, H200; torchao)")
    p.add_argument(
        "--measure-layers",
        type=count_arg("--measure-layers", 1),
        default=0,
        help="profile the model built at this many layers and tile the last one to --layers "
        "(a model too large to profile whole; the profile says so)",
    )
    p.add_argument("-o", "--output", type=output_file, help="where to write the profile JSON")
    p.set_defaults(func=run)


def _measured_workload(workload: Workload, layers: int) -> Workload:
    """The model to profile: `workload` itself, or (`layers`, --measure-layers) the same
    model at that many layers, to tile up to the workload's."""
    if not layers:
        return workload
    if workload.layers <= layers:
        raise ConfigError(
            f"--measure-layers {layers} tiles a profile up to --layers, which is "
            f"{workload.layers or 'the model default'}: give --layers above {layers}"
        )
    return replace(workload, layers=layers)


def print_profile(profile: Profile, micro_batch: int | None = None) -> None:
    size = micro_batch or max(profile.micro_batch_sizes)
    table = Table(
        title=f"{profile.model} on {profile.dataset}, {profile.device}, "
        f"{profile.dtype}, micro-batch {size}"
    )
    graphs = profile.graph_times
    columns = ["block", "type", "forward", "B", "W", "output", "saved", "parameters"]
    if graphs:  # device times as the runtime's CUDA graphs replay them
        columns[5:5] = ["graph F", "graph BW"]
    for col in columns:
        table.add_column(col, justify="left" if col == "type" else "right")

    def graph_cells(forward: float, backward: float) -> list[str]:
        return [human_seconds(forward), human_seconds(backward)] if graphs else []

    for i, block in enumerate(profile.blocks):
        c = profile.cost(i, size)
        table.add_row(
            str(i),
            block.name,
            human_seconds(c.forward),
            human_seconds(c.backward_input),
            human_seconds(c.backward_weight),
            *graph_cells(c.graph_forward, c.graph_backward),
            human_bytes(c.output_bytes),
            human_bytes(c.saved_bytes),
            human_count(block.params),
        )
    whole = profile.stage(0, profile.num_blocks, size)
    table.add_row(
        "",
        "total",
        human_seconds(whole.forward),
        human_seconds(whole.backward_input),
        human_seconds(whole.backward_weight),
        *graph_cells(whole.graph_forward, whole.graph_backward),
        "",
        human_bytes(whole.activation_bytes),
        human_count(profile.params),
        style="bold",
    )
    console.print(table)
    spread = profile.host.window_spread()
    if spread:
        worst = max(spread, key=spread.__getitem__)
        console.print(
            f"host: the whole model's host time moved by up to {spread[worst]:.0%} between "
            f"{profile.host.windows} windows (micro-batch {worst}); each size keeps the median"
        )
    if profile.graph_failure:
        console.print(f"[yellow]no CUDA graph times: {profile.graph_failure}[/]")


def run(args: argparse.Namespace) -> int:
    workload = workload_from_args(args)
    sizes = tuple(parse_int_list(args.micro_batch_sizes, "--micro-batch-sizes"))
    options = ProfileOptions(
        micro_batch_sizes=sizes,
        device=args.device,
        dtype=args.dtype,
        autocast=args.autocast,
        warmup=args.warmup,
        repeats=args.repeats,
        offload=True if args.offload else None,
        host_windows=args.host_windows,
        hide_issue=args.hide_issue,
        graph_times=args.graph_times,
        compile=args.compile,
        channels_last=args.channels_last,
        float8=args.float8,
    )
    if args.float8 and (why := float8.why_not("cuda" if args.device != "cpu" else "cpu")):
        raise ConfigError(why)
    earlier = [Profile.load(path) for path in args.pool_host]  # a bad file fails before profiling
    measured = _measured_workload(workload, args.measure_layers)
    check_model_size(measured, device=args.device)
    model = measured.build()
    for path, other in zip(args.pool_host, earlier, strict=True):
        why = pool_mismatch(
            other,
            model=workload.model,
            dataset=workload.spec.name,
            workload=workload.to_dict(),
            dtype=args.dtype,
            autocast=args.autocast,
            device=devices.name(devices.resolve(args.device)),
            blocks=[block_name(b) for b in model],
            sizes=sizes,
        )
        if why:
            raise ConfigError(f"--pool-host {path} cannot pool with this profile: {why}")
    note_sizes(workload)
    with progress() as bar:
        task = bar.add_task("profiling", total=len(model) * len(set(sizes)))

        def step(label: str) -> None:
            bar.update(task, advance=1, description=f"profiling {label}")

        profile = profile_model(
            model,
            workload.spec,
            options,
            model_name=workload.model,
            workload=measured.to_dict(),
            progress=step,
        )
    if measured is not workload:
        profile = tiled(profile, measured.layers, workload.layers, layer_repeat(workload))
        console.print(f"profile {profile.tiled}")
    for path, other in zip(args.pool_host, earlier, strict=True):
        why = poolable(profile, other)
        if why:
            raise ConfigError(f"--pool-host {path} cannot pool with this profile: {why}")
    note_sizes(workload)
    if earlier:
        profile = pool_host(profile, [profile, *earlier])
        console.print(f"host costs: the mean of {profile.host.pooled} profiles' readings")
    print_profile(profile)
    if args.output:
        profile.save(args.output)
        console.print(f"profile written to {args.output}")
    return 0
