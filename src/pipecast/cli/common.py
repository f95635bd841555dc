"""Arguments shared by verbs: which model and data set, counts."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

# re-exported: verbs (report among them) take their output types from here
from pipecast.cli.paths import output_dir as output_dir
from pipecast.cli.paths import output_file as output_file
from pipecast.errors import ConfigError
from pipecast.values.data.registry import (
    DEFAULT_SEQ_LEN,
    DEFAULT_VOCAB,
    DEFAULT_WIDTH,
    dataset_names,
)
from pipecast.values.models.registry import get_entry, model_names
from pipecast.values.models.sources import default_dataset, is_source_path, library_of
from pipecast.values.models.workload import Workload

DTYPE_HELP = "precision of the weights and the compute"
AUTOCAST_HELP = "fp32 weights, the compute autocast to --dtype"
OPTIMIZER_HELP = (
    "sgd (no state), momentum (state: one copy of the weights) or adam (two copies); its "
    "state counts in the memory per rank"
)
RECOMPUTE_HELP = (
    "all: keep each stage's input alone and run its forward again in the backward (less "
    "memory, more compute; each block's under FSDP); all-but-last: every micro-batch of a "
    "step but the last; selective: keep the matrix products' and attention's outputs and "
    "run the cheap ops between them again, a block at a time"
)
SHARD_OPTIMIZER_HELP = (
    "each data-parallel replica keeps the optimizer's state for its share of the weights "
    "only, steps that share and gathers the rest (ZeRO-1); with --replicas 2 or more "
    "holding whole copies (--shard none)"
)
MICRO_BATCHES_HELP = "micro-batches per step: the batch (a replica's share) split this many ways"


def add_workload_args(
    parser: argparse.ArgumentParser, *, required: bool = True, model_note: str = ""
) -> None:
    """--model and what sizes it; `model_note`: when a --model that argparse does not
    require is needed after all (' (required, unless ...)')."""
    group = parser.add_argument_group("workload")
    group.add_argument(
        "--model",
        required=required,
        help=f"zoo model ({', '.join(model_names())}), torchvision:NAME, timm:NAME, hf:TYPE "
        f"(e.g. hf:gpt2) or package.module:factory returning any nn.Module{model_note}",
    )
    group.add_argument(
        "--dataset",
        type=dataset_arg,
        help=f"data set ({', '.join(dataset_names())}); default: the model's own",
    )
    for flag, minimum, default, about in WORKLOAD_SIZES:
        group.add_argument(flag, type=count_arg(flag, minimum), default=default, help=about)


WORKLOAD_SIZES = (
    ("--seq-len", 1, DEFAULT_SEQ_LEN, "sequence length"),
    ("--vocab", 1, DEFAULT_VOCAB, "vocabulary (tokens)"),
    ("--width", 1, DEFAULT_WIDTH, "embedding width"),
    ("--layers", 0, 0, "transformer layers (0: the model's own)"),
    ("--heads", 0, 0, "attention heads (0: the model's own)"),
    ("--kv-heads", 0, 0, "key/value heads, grouped-query attention (0: as many as --heads)"),
    ("--ffn", 0, 0, "feed-forward width (0: the model's own, 4 x width; Llama's 8/3 x width)"),
)
"""The workload's sizes: flag, least value, default, help."""


def dataset_arg(text: str) -> str:
    """An argparse type for --dataset: a data set pipecast knows."""
    from pipecast.errors import UnknownNameError

    if text not in dataset_names():
        raise argparse.ArgumentTypeError(str(UnknownNameError("dataset", text, dataset_names())))
    return text


def check_model_named(args: argparse.Namespace, without: str) -> None:
    """A ConfigError where a workload option (--dataset, --layers, ...) is given without the
    --model it describes: the verb would ignore it and do `without` instead (a phrase:
    'recommend plans ...')."""
    if args.model is not None:
        return
    given = [("--dataset", args.dataset)] if args.dataset is not None else []
    for flag, _, default, _ in WORKLOAD_SIZES:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value != default:
            given.append((flag, value))
    if given:
        flag, value = given[0]
        raise ConfigError(
            f"{flag} {value} describes the model, and no --model is given: {without}, "
            "which would ignore it; give --model NAME with it"
        )


def workload_from_args(args: argparse.Namespace) -> Workload:
    dataset = args.dataset
    if dataset is None:
        model = args.model
        dataset = (
            default_dataset(model) if is_source_path(model) else get_entry(model).default_dataset
        )
    return Workload(
        model=args.model,
        dataset=dataset,
        seq_len=args.seq_len,
        vocab=args.vocab,
        width=args.width,
        layers=args.layers,
        heads=args.heads,
        kv_heads=args.kv_heads,
        ffn=args.ffn,
    )


def note_sizes(workload: Workload) -> None:
    """One line where a Hugging Face model is built at other sizes than its own
    configuration's (hf:gpt2 at pipecast's width 512 and vocabulary 8,192, not GPT-2's 768
    and 50,257), naming the flags that build its own."""
    if library_of(workload.model) != "hf":
        return
    from pipecast.cli.console import console
    from pipecast.values.models.sources import hf_sizes

    _, _, model_type = workload.model.partition(":")
    sizes = {
        "layers": workload.layers,
        "width": workload.width,
        "heads": workload.heads,
        "kv_heads": workload.kv_heads,
        "ffn": workload.ffn,
    }
    if note := hf_sizes(model_type, workload.spec, **sizes):
        console.print(note, highlight=False, soft_wrap=True)


def parse_int_list(text: str, what: str) -> list[int]:
    """'8,16,32' -> [8, 16, 32], each at least 1."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"{what} must be comma-separated integers, got '{text}'") from None
    if not values or any(v < 1 for v in values):
        raise ConfigError(f"{what} must be integers of at least 1, got '{text}'")
    return values


def count_arg(flag: str, minimum: int, *, also: str = "") -> Callable[[str], int | str]:
    """An argparse type for `flag`: a whole number of at least `minimum`, or the word
    `also` where one is given."""

    def parse(text: str) -> int | str:
        if also and text == also:
            return text
        either = f" or '{also}'" if also else ""
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{flag} takes a count{either}, got {text!r}"
            ) from None
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"{flag} takes a count of at least {minimum}, got {value}"
            )
        return value

    return parse


def number_arg(flag: str, *, minimum: float = 0.0, above: bool = False) -> Callable[[str], float]:
    """An argparse type for `flag`: a finite number of at least `minimum` (above it, where
    `above`); NaN and infinity are refused, since no rate, scale or duration is either."""
    bound = f"above {minimum:g}" if above else f"of at least {minimum:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < minimum or (above and value == minimum):
            raise argparse.ArgumentTypeError(f"{flag} takes a number {bound}, got {text!r}")
        return value

    return parse


MAX_MEMORY_GIB = 2**14
"""The most --memory-limit takes: 16 TiB, beyond any GPU's memory or any one host's."""


def gib_arg(text: str) -> float:
    """An argparse type for --memory-limit: GiB of memory per GPU, above 0 and at most
    MAX_MEMORY_GIB (a larger figure is a slip of the keyboard, and plans for no machine)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"--memory-limit takes GiB above 0, got {text!r}")
    if value > MAX_MEMORY_GIB:
        raise argparse.ArgumentTypeError(
            f"--memory-limit takes GiB per GPU (or CPU rank), at most {MAX_MEMORY_GIB} (16 TiB, "
            f"beyond any one device or host), got {text!r}"
        )
    return value


def margin_arg(text: str) -> float:
    """An argparse type for --memory-margin: the fraction of GPU memory kept free, in [0, 1)
    (partition.methods.check_margin's rule)."""
    from pipecast.planning.partition.methods import check_margin

    try:
        return check_margin(float(text))
    except (ValueError, ConfigError):
        raise argparse.ArgumentTypeError(
            f"--memory-margin takes a fraction in [0, 1) of GPU memory to keep free, got {text!r}"
        ) from None


def schedule_arg(text: str) -> str:
    """An argparse type for --schedule: a schedule pipecast generates."""
    from pipecast.errors import UnknownNameError
    from pipecast.planning.schedules.generators import SCHEDULES

    if text not in SCHEDULES:
        raise argparse.ArgumentTypeError(str(UnknownNameError("schedule", text, list(SCHEDULES))))
    return text


def add_virtual_arg(p: argparse.ArgumentParser) -> None:
    """--virtual-stages, declared once for the verbs that run or price one schedule."""
    p.add_argument(
        "--virtual-stages",
        type=count_arg("--virtual-stages", 2),
        default=0,
        help="interleaved: the stages each pipeline rank runs, any from 2 (default 2); the "
        "partition then has GPUs x this many stages",
    )


def methods_arg(text: str) -> tuple[str, ...]:
    """An argparse type for --methods: comma-separated partition methods, each known."""
    from pipecast.errors import PipecastError
    from pipecast.planning.partition.methods import check_methods

    try:
        return check_methods(tuple(m.strip() for m in text.split(",") if m.strip()))
    except PipecastError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None  # argparse names --methods
