"""`--partition auto`: a quick profile at the run's micro-batch size, then the default split."""

from __future__ import annotations

from torch import nn

from pipecast.data.spec import DatasetSpec
from pipecast.hardware.cluster import Cluster
from pipecast.partition.types import Partition
from pipecast.profile.profiler import ProfileOptions, profile_model
from pipecast.profile.types import Profile
from pipecast.recommend.predict import partition_for
from pipecast.recommend.strategy import Strategy


def quick_profile(
    model: nn.Sequential,
    spec: DatasetSpec,
    micro_batch: int,
    *,
    device: str,
    dtype: str,
    autocast: bool,
    name: str = "model",
) -> Profile:
    """A few repeats at one size: enough to balance stages, seconds to take."""
    options = ProfileOptions(
        micro_batches=(micro_batch,),
        device=device,
        dtype=dtype,  # type: ignore[arg-type]
        autocast=autocast,
        warmup=1,
        repeats=3,
    )
    return profile_model(model, spec, options, model_name=name)


def auto_partition(
    profile: Profile, cluster: Cluster, strategy: Strategy, micro_batch: int
) -> Partition:
    return partition_for(profile, cluster, strategy, micro_batch)
