"""Do a pipeline's transfers take device time from the compute beside them? The simulator
runs them on the link beside compute for free (Costs.overlap_comm). Yet over the 28 stored
runs, device-bound pipeline rows over 2 and 4 GPUs were predicted fast: VGG-16/ImageNet's by
4-9% on every run (benchmarks/README.md). A torch DDP all-reduce beside the backward
turned out to slow it by about its own time, and the simulator now has it share the device
(simulate.engine._finish_step). NCCL's sends and receives also run as kernels on both GPUs.

Each stored run is re-predicted with every transfer's time also added to the device time of
the actions at its ends, times a share: `sender` (the sending action pays it all), `both`
(sender and receiver each pay it all), `half` (each pays half). CPU only, about 5 minutes.

    cd benchmarks && python3 transfer_share_whatif.py > results/transfer-share-whatif.txt

Each line: a run, then per variant the median and worst |error| and the rows within 20%;
last, each variant's totals and its median signed error on device-bound pipeline rows.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from whatif import compare, totals

import pipecast.recommend.predict as predict_module
from pipecast.simulate.costs import Costs

PLAIN = predict_module.costs_from_profile
VARIANTS: dict[str, tuple[float, float]] = {
    "plain": (0.0, 0.0),
    "sender": (1.0, 0.0),
    "both": (1.0, 1.0),
    "half": (0.5, 0.5),
}


def sharing(send: float, receive: float) -> Callable[..., Costs]:
    """costs_from_profile with `send` and `receive` shares of each transfer's time added
    to the device time of the actions that send and receive it."""

    def costs(*args: Any, **kwargs: Any) -> Costs:
        c = PLAIN(*args, **kwargs)
        st = list(c.stages)
        for s in range(len(st) - 1):
            fwd = c.forward_transfer[s] if s < len(c.forward_transfer) else 0.0
            bwd = c.backward_transfer[s] if s < len(c.backward_transfer) else 0.0
            # forward: stage s sends, s+1 receives; backward: s+1 sends, s receives
            for stage, f, b in ((s, send * fwd, receive * bwd), (s + 1, receive * fwd, send * bwd)):
                t = st[stage]
                st[stage] = replace(
                    t,
                    forward=t.forward + f,
                    backward=t.backward + b,
                    backward_input=t.backward_input + b,
                )
        return replace(c, stages=tuple(st))

    return costs


def main() -> None:
    def patch(send: float, receive: float) -> Callable[[], None]:
        def apply() -> None:
            predict_module.costs_from_profile = sharing(send, receive)  # type: ignore[assignment]

        return apply

    def restore() -> None:
        predict_module.costs_from_profile = PLAIN

    runs = compare({name: patch(*shares) for name, shares in VARIANTS.items()}, restore)
    for name, per_run in runs.items():
        pipe = [
            c.error
            for cs in per_run
            for c in cs
            if c.label.split(" ")[2:3] == ["pipecast"] and not c.host_bound
        ]
        print(
            f"{name}: {totals(per_run, runs['plain'])}; device-bound pipeline rows ({len(pipe)}) "
            f"signed median {statistics.median(pipe):+.1%}"
        )


if __name__ == "__main__":
    main()
