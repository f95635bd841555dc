"""Arguments shared by the planning verbs: a profile, a cluster, a batch."""

from __future__ import annotations

import argparse

from pipecast.cli.common import OPTIMIZER_HELP, margin_arg
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.hardware.load import default_cluster, load_cluster
from pipecast.values.profile.types import Profile


def add_profile_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", required=True, help="profile JSON from `pipecast profile`")
    parser.add_argument(
        "--cluster",
        help="cluster JSON (probe or description) or preset name; "
        "default: a preset for the profile's device",
    )
    parser.add_argument(
        "--optimizer", choices=("sgd", "momentum", "adam"), default="sgd", help=OPTIMIZER_HELP
    )
    parser.add_argument(
        "--memory-margin", type=margin_arg, default=0.1, help="fraction of GPU memory kept free"
    )


def load_inputs(args: argparse.Namespace, gpus: int) -> tuple[Profile, Cluster]:
    profile = Profile.load(args.profile)
    cluster = load_cluster(args.cluster) if args.cluster else default_cluster(profile.device, gpus)
    return profile, cluster


def default_batch(profile: Profile, per_step: int) -> int:
    """Micro-batch = the largest profiled size, times the micro-batches per step."""
    return max(profile.micro_batch_sizes) * per_step
