"""The recommender and activations on the host: offered only where the strategy does not
fit without them, and the answer where nothing else fits."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.values.profile.helpers import shipped_profile

from pipecast.cli.main import main
from pipecast.errors import ConfigError
from pipecast.planning.recommend.predict import Prediction, predict
from pipecast.planning.recommend.rank import recommend
from pipecast.values.hardware.presets import describe, preset
from pipecast.values.hardware.units import human_bytes
from pipecast.values.profile.reference import shipped
from pipecast.values.profile.types import BlockCost, BlockProfile, Profile
from pipecast.values.strategy import Strategy
from pipecast.values.training import OFFLOADS


def _ranked(gib: float) -> list[Prediction]:
    cluster = replace(preset("h200-nvlink"), memory_bytes=int(gib * 2**30))
    return list(recommend(shipped_profile("resnet18", "h200"), cluster, 256, gpus=2).ranked)


def test_with_memory_to_spare_the_fastest_keeps_its_activations() -> None:
    ranked = _ranked(140)
    assert ranked[0].strategy.offload == "none"
    assert all(p.strategy.offload == "none" for p in ranked)


def test_when_nothing_fits_as_it_is_activations_go_to_the_host() -> None:
    """ResNet-18 at batch 256 over 2 GPUs of 0.2 GiB (0.18 usable): every plain strategy
    with whole copies of the weights needs more; with its activations on the host, data
    parallelism accumulating 64 fits (sharding the weights, which are small beside
    ResNet-18's activations, fits only at 128 micro-batches, four times slower). Fastest:
    two stages of 16 micro-batches, recomputed, the weights streamed and each checkpoint's
    input on the host; then FSDP at 32 micro-batches with every block recomputed, nothing
    on the host; of whole copies, at 32 micro-batches, the weights streamed and every
    block recomputed on its own (one more forward, against copying the activations out and
    back). Every offload that fits is ranked by its prediction: where the same plan runs
    with its activations alone on the host and with its weights streamed too, the streamed
    one, which only adds copies, ranks below it."""
    ranked = _ranked(0.2)
    whole = [p for p in ranked if p.strategy.shard == "none" and p.strategy.kind == "data"]
    recomputed = [p for p in whole if p.strategy.recompute == "all"]
    assert all(p.strategy.offload in ("weights", "both", "all") for p in recomputed)
    assert whole and all(p.strategy.offload != "none" for p in whole)
    first, second = (p.strategy for p in ranked[:2])
    assert (first.stages, first.microbatches, first.recompute, first.offload) == (
        2,
        16,
        "all",
        "all",
    )
    assert second.shard != "none" and second.recompute == "all" and second.offload == "none"
    assert second.microbatches == 32
    assert whole[0] in recomputed and whole[0].strategy.microbatches == 32
    best = next(p for p in whole if p not in recomputed)
    assert best.strategy.offload == "activations" and best.strategy.microbatches == 64
    place = {p.strategy: i for i, p in enumerate(ranked)}
    pairs = [
        (place[replace(p.strategy, offload="activations")], i)
        for i, p in enumerate(ranked)
        if p.strategy.offload == "all" and replace(p.strategy, offload="activations") in place
    ]
    assert pairs and all(light < streamed for light, streamed in pairs)
    assert best.fits and not best.strategy.cuda_graphs
    assert best.peak_host_memory > 0
    plain = replace(best.strategy, offload="none")
    assert plain not in {p.strategy for p in ranked}


def test_cpu_ranks_are_never_offered_the_host() -> None:
    """The same squeeze on CPU ranks: their memory is the host's already, so nothing is
    offered with its activations, optimizer or weights \"on the host\"."""
    cluster = replace(preset("h200-nvlink"), memory_bytes=int(0.2 * 2**30))
    profile = replace(shipped_profile("resnet18", "h200"), device="cpu")
    ranked = recommend(profile, cluster, 256, gpus=2).ranked
    assert ranked and all(p.strategy.offload == "none" for p in ranked)


def test_a_memory_limit_that_is_not_a_size_stops_before_anything_runs() -> None:
    with pytest.raises(SystemExit) as stop:
        main(["recommend", "--model", "lenet5", "--memory-limit", "0"])
    assert stop.value.code == 2


def _gpt(gib: float) -> Prediction:
    (profile,) = [p for p in shipped("h200") if p.model == "transformer"]
    four = replace(preset("h200-nvlink"), gpus_per_node=4, memory_bytes=int(gib * 2**30))
    return recommend(profile, four, 32, gpus=4).best


def test_recomputation_where_it_fits_offload_where_nothing_else_does() -> None:
    """The GPT stack (batch 32) on 4 GPUs. At 3 GiB a split recomputing every micro-batch
    fits, and beats copying 64 MB a layer to the host and back (on 4 x H200 the offloaded
    1F1B ran 4.7x slower than recomputation on the same split); at 2 GiB only an offload
    fits: the fastest streams the weights and recomputes (copying a stage's weights in
    twice a micro-batch, against a layer's 64 MB of activations out and back). The
    partitioner must count what recomputation and offloading leave on the GPU, or it finds
    no split for either."""
    roomier = _gpt(3.0)
    assert roomier.strategy.recompute == "all" and roomier.strategy.offload == "none"
    tight = _gpt(2.0)
    assert tight.strategy.offload == "weights" and tight.strategy.recompute == "all"
    assert tight.fits


def test_adam_state_goes_to_the_host_where_the_weights_alone_fit() -> None:
    """4 GiB of weights under Adam on one GPU of 12 GiB (10.8 usable): weights, gradients
    and Adam's 8 GiB of state need 16; with the state on the host, 8 fit. Moving the
    activations or streaming the weights too would only add copies: offered, ranked
    below."""
    from tests.planning.partition.test_partition import make_profile

    from pipecast.values.hardware.presets import describe

    profile = make_profile([1e-3] * 4, params=[2**30] * 4)
    one = describe(gpus_per_node=1, memory="12GiB")
    rec = recommend(profile, one, 8, optimizer="adam")
    assert rec.best.strategy.offload == "optimizer"
    assert all(p.strategy.offload != "none" for p in rec.ranked)
    streamed = [p.step_time for p in rec.ranked if p.strategy.offload in ("weights", "all")]
    assert streamed and min(streamed) > rec.best.step_time  # copies in on every forward
    assert recommend(profile, one, 8).best.strategy.offload == "none"  # SGD keeps no state


def test_streamed_weights_are_offered_recomputed_where_they_can_run() -> None:
    """A strategy that does not fit is offered its weights streamed and every block
    recomputed (from a recomputing one, its weights streamed), eagerly; not with its stage
    compiled as one graph, which can't recompute a block at a time, nor under PipeDream."""
    from pipecast.planning.recommend.rank import offloaded

    def streamed(s: Strategy) -> list[tuple[str, str, bool]]:
        got = offloaded(s, "adam")
        return [(o.offload, o.recompute, o.cuda_graphs) for o in got if o.offload == "weights"]

    graphed = Strategy(kind="single", microbatches=4, cuda_graphs=True)
    assert streamed(graphed) == [("weights", "none", False), ("weights", "all", False)]
    assert streamed(replace(graphed, recompute="all")) == [("weights", "all", False)]
    whole = replace(graphed, compile="stage")
    assert streamed(whole) == [("weights", "none", False)]
    assert streamed(replace(whole, recompute="all")) == []
    assert streamed(Strategy(kind="pipeline", stages=2, schedule="pipedream")) == []


def _four_blocks() -> tuple[Profile, int]:
    """Four blocks of 4 MiB of weights, each saving 8 MiB and handing the next 0.25 MiB, on a
    GPU whose host link (20 GB/s) is slower than the forward: and the bytes the smallest
    plan needs, by hand. Streamed, recomputed and the checkpoints' inputs on the host, one
    GPU holds the gradients in flight to the host (two blocks', 8 MiB: each leaves as it is
    made), two blocks' weights (8), one block's activations recomputed (8) and its input
    brought back (0.25), the loss (two fp32 copies of the 0.25 MiB output: 0.5) and the
    batch (one 4-byte sample)."""
    mib = 2**20
    weights, saved, out = 4 * mib, 8 * mib, mib // 4
    cost = BlockCost(
        forward=1e-4, backward_input=1e-4, backward_weight=1e-4, backward=2e-4,
        output_bytes=out, saved_bytes=saved,
    )  # fmt: skip
    blocks = tuple(
        BlockProfile(index=i, name=f"b{i}", params=weights // 4, param_bytes=weights,
                     input_counted=True, costs={1: cost})
        for i in range(4)
    )  # fmt: skip
    profile = Profile(
        model="hand", dataset="x", device="gpu", dtype="fp32", torch_version="t",
        micro_batch_sizes=(1,), input_bytes_per_sample=4, blocks=blocks,
    )  # fmt: skip
    return profile, 2 * weights + 2 * weights + saved + out + 2 * out + 4


def test_recommend_reaches_the_smallest_plan_and_names_it_below() -> None:
    """One GPU, batch 1. Of every way to run it (each offload, recomputed or not), the
    weights streamed and recomputed, with the blocks' inputs on the host, need the least,
    the bytes counted by hand. On a GPU of
    exactly that (no margin) recommend answers with it, the only plan that fits; a byte
    less and it refuses, naming that plan, its need in bytes and the GPU it fits."""
    profile, need = _four_blocks()
    gpu = describe(gpus_per_node=1, memory="1GiB")
    needs = {}
    for offload in OFFLOADS:
        for recompute in ("none", "all"):
            strategy = Strategy(kind="single", offload=offload, recompute=recompute)  # type: ignore[arg-type]
            needs[strategy] = predict(profile, gpu, strategy, 1, memory_margin=0.0).peak_memory
    smallest = min(needs, key=lambda s: needs[s])
    assert (smallest.offload, smallest.recompute) == ("all", "all")
    assert needs[smallest] == need
    # kept on the device instead, blocks 1-3's inputs cost 0.75 MiB less a restored one
    streamed = Strategy(kind="single", offload="weights", recompute="all")
    assert needs[streamed] - need == 2 * 2**20 // 4
    rec = recommend(profile, replace(gpu, memory_bytes=need), 1, memory_margin=0.0)
    assert [p.strategy.label() for p in rec.ranked] == [smallest.label()]
    # the host holds the weights, their gradients (SGD: no state): 2 x 16 MiB, and the
    # inputs of blocks 1-3
    assert rec.best.host_memory == 32 * 2**20 + 3 * 2**20 // 4
    assert "32.75 MiB of the host's memory, pinned" in rec.reason()
    with pytest.raises(ConfigError) as refused:
        recommend(profile, replace(gpu, memory_bytes=need - 1), 1, memory_margin=0.0)
    said = str(refused.value)
    assert f"the closest, {smallest.label()}, needs {human_bytes(need)} per GPU" in said
    assert f"1 B short ({need:,} bytes; it fits GPUs of {human_bytes(need)})" in said


def test_the_host_holds_every_replicas_offload() -> None:
    """Adam's state on the host for two replicas of four 1 GiB blocks: each rank pins its
    weights, gradients and two moments (16 GiB); the machine holds both (32 GiB)."""
    from tests.planning.partition.test_partition import make_profile

    profile = make_profile([1e-3] * 4, params=[2**30] * 4)
    two = describe(gpus_per_node=2, memory="80GiB")
    strategy = Strategy(kind="data", replicas=2, offload="optimizer")
    pred = predict(profile, two, strategy, 8, optimizer="adam")
    assert pred.peak_host_memory == 16 * 2**30 and pred.host_memory == 32 * 2**30
