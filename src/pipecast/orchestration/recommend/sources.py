"""Where a recommendation's profiles and cluster come from: given, shipped with pipecast,
cached from an earlier run, or measured here (calibrate.py), each saying which."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pipecast.errors import ConfigError
from pipecast.orchestration.recommend.calibrate import (
    calibrated_cluster,
    calibrated_profile,
    profile_sizes,
)
from pipecast.values.hardware.cluster import Cluster
from pipecast.values.hardware.presets import gpu_kind
from pipecast.values.models.workload import Workload
from pipecast.values.profile.reference import label, reference_profile, shipped
from pipecast.values.profile.types import Profile
from pipecast.values.training import Compile

if TYPE_CHECKING:
    from pipecast.orchestration.recommend.session import Events, Request

Source = Literal["given", "cached", "measured", "shipped", "preset", "probed"]


def shipped_profile(
    workload: Workload, dtype: str, autocast: bool, target: str, here: str
) -> Profile:
    """The shipped profile for GPUs this machine does not have, or a ConfigError that says
    what to do instead."""
    found = None if autocast else reference_profile(workload, dtype, target)
    if found is not None:
        return found
    kind = gpu_kind(target) or ""
    ships = ", ".join(label(p) for p in shipped(kind)) if kind else ""
    raise ConfigError(
        f"the cluster's devices are {target} but this machine would profile on "
        f"{here}, whose times do not carry to them: profile it on that GPU (pipecast profile "
        f"--model {workload.model} --dataset {workload.dataset} --dtype {dtype} "
        "--micro-batch-sizes 8,16,32,64 --device cuda -o p.json) and pass --profile p.json"
        + (f"; pipecast ships {kind.upper()} profiles of {ships}" if ships else "")
    )


def profile_for(
    r: Request, elsewhere: bool, target: str, here: str, ev: Events
) -> tuple[Profile, Source]:
    if r.profile is not None:
        return r.profile, "given"
    assert r.workload is not None and r.dtype is not None
    if elsewhere:
        return shipped_profile(r.workload, r.dtype, r.autocast, target, here), "shipped"
    profile, cached = measured(r, ev, ("off", False, False))
    return profile, "cached" if cached else "measured"


def measured(r: Request, ev: Events, execution: tuple[Compile, bool, bool]) -> tuple[Profile, bool]:
    """The request's model profiled here with its blocks run as `execution` says (cached:
    calibrate.calibrated_profile); (profile, whether it came from the cache)."""
    assert r.workload is not None and r.dtype is not None
    if ev.calibrating is not None:
        plain = execution == ("off", False, False)
        ev.calibrating("profiling" + ("" if plain else " " + describe_execution(execution)))
    return calibrated_profile(
        r.workload,
        profile_sizes(r.batch, r.gpus),
        device=r.device,
        dtype=r.dtype,
        autocast=r.autocast,
        progress=ev.profiling,
        refresh=r.recalibrate,
        ranks=r.gpus,
        batch=r.batch,
        execution=execution,
    )


def variants_for(
    r: Request, profile: Profile, source: Source, elsewhere: bool, ev: Events
) -> list[Profile]:
    """A profile of each other way to run the blocks the request asks for, measured here
    (cached like the plain one); none where the plain one is shipped or given, whose
    machine is not this one."""
    wanted = [e for e in r.executions if e != profile.execution]
    if not wanted:
        return []
    if elsewhere or source == "given" or r.workload is None:
        ev.say(
            "compiled, channels-last and Float8 strategies need a profile measured that way "
            "on the GPU planned for: not ranked"
        )
        return []
    return [measured(r, ev, execution)[0] for execution in wanted]


def describe_execution(execution: tuple[Compile, bool, bool]) -> str:
    """'compiled, channels-last, Float8' in words ('eager' for none of them)."""
    compile_, channels_last, in_float8 = execution
    words = [w for w, on in (("compiled", compile_ != "off"), ("Float8", in_float8),
                             ("channels-last", channels_last)) if on]  # fmt: skip
    return ", ".join(words) or "eager"


def cluster_for(r: Request, ev: Events, *, defaulted: bool) -> tuple[Cluster, Source]:
    if r.cluster is not None:
        return r.cluster, "preset" if defaulted else "given"
    if ev.calibrating is not None:
        ev.calibrating("probing")
    cluster, cached = calibrated_cluster(r.gpus, r.device, refresh=r.recalibrate)
    return cluster, "cached" if cached else "probed"
