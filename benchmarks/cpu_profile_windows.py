"""Would a CPU profile gain from reading its whole-model passes in several windows, as GPU
profiles do (ProfileOptions.host_windows)? A CPU profile takes each size's in-context passes
in one window (profiler.HOST_MODELLED); this profiles one model six times on the local CPU,
alternately with one window and with three (three being the GPUs' default), and prints each
profile's time and its forward-plus-backward total per micro-batch size, then how far the
three profiles of each kind lie apart per size ((largest - smallest) / median).

    cd benchmarks && python3 cpu_profile_windows.py mobilenetv2 > results/cpu-profile-windows.txt

(CPU only; about 13 minutes for MobileNetV2 on CIFAR-10 shapes on the 2-core machine.)
"""

from __future__ import annotations

import statistics
import sys
import time

import common  # noqa: F401  (puts src/ on the path)

import pipecast.profile.profiler as profiler
from pipecast.models.workload import Workload
from pipecast.profile.options import ProfileOptions

SIZES = (1, 2, 4, 8, 16, 32)


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "mobilenetv2"
    totals: dict[int, list[dict[int, float]]] = {1: [], 3: []}
    took: dict[int, list[float]] = {1: [], 3: []}
    for i, windows in enumerate([1, 3, 1, 3, 1, 3]):
        # windows beyond one are only read on the device types listed here
        profiler.HOST_MODELLED = ("cuda", "cpu") if windows > 1 else ("cuda",)
        workload = Workload(model=model, dataset="cifar10")
        start = time.perf_counter()
        profile = profiler.profile_model(
            workload.build(),
            workload.spec,
            ProfileOptions(micro_batches=SIZES, host_windows=windows),
            model_name=model,
            workload=workload.to_dict(),
        )
        took[windows].append(time.perf_counter() - start)
        total = {
            mb: sum(b.costs[mb].forward + b.costs[mb].backward for b in profile.blocks)
            for mb in SIZES
        }
        totals[windows].append(total)
        shown = ", ".join(f"{mb}: {t * 1e3:.1f}" for mb, t in total.items())
        print(f"profile {i}, {windows} window(s), {took[windows][-1]:.0f} s: ms {shown}")
    for windows, runs in totals.items():
        print(f"{windows} window(s): {', '.join(f'{t:.0f}' for t in took[windows])} s a profile")
        for mb in SIZES:
            xs = [r[mb] for r in runs]
            spread = (max(xs) - min(xs)) / statistics.median(xs)
            shown = ", ".join(f"{x * 1e3:.1f}" for x in xs)
            print(f"  micro-batch {mb:2d}: {shown} ms, apart by {spread:.1%}")


if __name__ == "__main__":
    main()
