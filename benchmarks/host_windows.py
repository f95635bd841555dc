"""Do a profile's host windows see different spells? GPT and VGG-16/CIFAR-10 (host-bound at
their smallest sizes) profiled on one GPU with five windows of whole-model passes each
(ProfileOptions.host_windows), every window's whole-model host seconds kept
(Profile.window_host), with hostspeed.issue() read before and after (`host_windows.json`).

    OUT=/tmp/hw python3 benchmarks/host_windows.py          (one GPU; about two minutes)
"""

from __future__ import annotations

import statistics
import time

import torch
from common import dump, log

from pipecast.bench.suites import GPT
from pipecast.hardware import hostspeed
from pipecast.models.workload import Workload
from pipecast.profile.profiler import ProfileOptions, profile_model

WINDOWS = 5
"""More than the default three: the spread among them is the point."""
RUNS = {"gpt": (GPT, (1, 2)), "vgg16_cifar": (Workload(model="vgg16", dataset="cifar10"), (4, 8))}


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results: dict[str, object] = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"
    }
    for name, (workload, sizes) in RUNS.items():
        began, before = time.time(), hostspeed.issue(torch.device(device))
        prof = profile_model(
            workload.build(),
            workload.spec,
            ProfileOptions(micro_batches=sizes, device=device, dtype="bf16", host_windows=WINDOWS),
            model_name=workload.model,
        )
        after = hostspeed.issue(torch.device(device))
        windows = {mb: list(v) for mb, v in prof.window_host.items()}
        results[name] = {"windows": windows, "issue_before": before, "issue_after": after}
        for mb, v in windows.items():
            spread = (max(v) - min(v)) / statistics.median(v) if v and min(v) > 0 else 0.0
            log(
                f"{name} mb {mb}: windows "
                + " ".join(f"{x * 1e3:.2f}" for x in v)
                + f" ms (max-min {spread:.0%} of the median), {time.time() - began:.0f} s"
            )
        dump("host_windows.json", results)


if __name__ == "__main__":
    main()
