"""Device times with the host's issuing hidden, against those without, on a run made with
`gpu_run.py --hidden-profiles`: how much of each model's profiled device time was the host
issuing it, and every configuration of the run predicted from either set of profiles
(CPU only).

    cd benchmarks && python3 hidden_issue.py results/<run> [results/<run> ...]

Where the host binds, an in-context pass's events time the host's issuing rather than the
device (the profiled device time equals the host time); in a pipeline a rank whose host runs
ahead of its data then runs the action at the device's speed (h100x4-run7 and -run8: the
last stage of VGG-16/CIFAR-10 took 46-47 us against 251-252 us profiled).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from combine import repredicted, run_profiles

from pipecast.bench.accuracy import comparisons, summary
from pipecast.profile.types import Profile


def device_share(plain: Profile, hidden: Profile) -> list[str]:
    """Per size: the hidden whole-model device forward and backward over the plain ones."""
    lines = []
    for mb in plain.micro_batches:
        if mb not in hidden.micro_batches:
            continue
        f = [sum(b.costs[mb].forward for b in p.blocks) for p in (plain, hidden)]
        bw = [sum(b.costs[mb].backward for b in p.blocks) for p in (plain, hidden)]
        hf = sum(b.costs[mb].host_forward for b in plain.blocks)
        lines.append(
            f"  mb {mb:4d}: forward {f[0] * 1e3:8.3f} -> {f[1] * 1e3:8.3f} ms "
            f"({f[1] / f[0]:.2f}x; host {hf * 1e3:.3f} ms), backward {bw[0] * 1e3:8.3f} -> "
            f"{bw[1] * 1e3:8.3f} ms ({bw[1] / bw[0]:.2f}x)"
        )
    return lines


def line(name: str, s: dict[str, float | int]) -> str:
    pct = lambda k: f"{100 * float(s.get(k, 0.0)):.1f}%"  # noqa: E731
    return (
        f"{name}: median {pct('median_abs_error')}, worst {pct('worst_abs_error')}, "
        f"{s.get('within_20_percent', 0)} within 20%; device-bound "
        f"{s.get('device_bound_configurations', 0)}: {pct('device_bound_median_abs_error')}; "
        f"host-bound {s.get('host_bound_configurations', 0)}: "
        f"{pct('host_bound_median_abs_error')}; picks {s.get('right', 0)}/{s.get('decisions', 0)}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", help="run directories with hidden_profile_*.json")
    for run in map(Path, ap.parse_args().runs):
        plain, hidden = run_profiles(run), run_profiles(run, "hidden_profile_")
        if not hidden:
            print(f"{run}: no hidden_profile_*.json (made by gpu_run.py --hidden-profiles)")
            continue
        print(f"{run}:")
        for key, p in plain.items():
            if key in hidden:
                print(f" {p.model}/{p.dataset}")
                print("\n".join(device_share(p, hidden[key])))
        both = {k: hidden.get(k, p) for k, p in plain.items()}
        before = comparisons(repredicted(run, plain))
        after = comparisons(repredicted(run, both))
        print(" " + line("plain profiles ", summary(before)))
        print(" " + line("hidden profiles", summary(after)))
        moved = sorted(
            zip(before, after, strict=True), key=lambda ba: -abs(ba[1].error - ba[0].error)
        )
        for b, a in moved[:12]:
            print(f"  {b.error:+7.1%} -> {a.error:+7.1%}  {b.label}")


if __name__ == "__main__":
    main()
