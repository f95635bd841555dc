"""Device times with the host's issuing hidden (ProfileOptions.hide_issue), against those
from plain passes: how much of each model's profiled device time was the host issuing it,
and every configuration of a run predicted from either set of profiles (CPU only).

    cd benchmarks && python3 hidden_issue.py results/<run> [results/<run> ...]

A run made with `gpu_run.py --hidden-profiles` (h100x4-run9, -run10: plain profiles first,
hidden_profile_*.json after the suite) or with `--plain-profiles` (the default profiles
hidden, plain_profile_*.json after the suite). The second set was taken minutes later, at
another host speed, so besides each set as taken this predicts from the first set's host
costs with the hidden set's device times, where every size of it hid the issuing (what
the profiler keeps from one session).

Where the host binds, an in-context pass's events time the host's issuing rather than the
device (the profiled device time equals the host time); in a pipeline a rank whose host runs
ahead of its data then runs the action at the device's speed (h100x4-run7 and -run8: the
last stage of VGG-16/CIFAR-10 took 46-47 us against 251-252 us profiled).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
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


DEVICE = ("forward", "backward", "backward_input", "backward_weight")


def with_device_times(plain: Profile, hidden: Profile) -> Profile:
    """`plain` with `hidden`'s device times, where every size of `hidden` hid the issuing."""
    if not hidden.issue_hidden:
        return plain
    blocks = tuple(
        replace(
            p,
            costs={
                mb: replace(c, **{k: getattr(h.costs[mb], k) for k in DEVICE})
                for mb, c in p.costs.items()
            },
        )
        for p, h in zip(plain.blocks, hidden.blocks, strict=True)
    )
    return replace(plain, blocks=blocks, loss=hidden.loss, issue_hidden=True)


def profile_sets(run: Path) -> tuple[dict[str, Profile], dict[str, Profile], bool]:
    """The run's plain and hidden profiles, and whether the plain ones came first."""
    hidden = run_profiles(run, "hidden_profile_")
    if hidden:
        return run_profiles(run), hidden, True
    return run_profiles(run, "plain_profile_"), run_profiles(run), False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", help="run directories with both sets of profiles")
    for run in map(Path, ap.parse_args().runs):
        plain, hidden, plain_first = profile_sets(run)
        if not plain or not hidden or plain.keys().isdisjoint(hidden.keys()):
            print(f"{run}: no second set of profiles (gpu_run.py --plain-profiles)")
            continue
        print(f"{run}:")
        for key, p in plain.items():
            if key in hidden:
                h = hidden[key]
                print(f" {p.model}/{p.dataset} (every size hidden: {h.issue_hidden})")
                print("\n".join(device_share(p, h)))
        sets = {
            "plain profiles ": plain,
            "hidden profiles": {k: hidden.get(k, p) for k, p in plain.items()},
            "host costs of the first set, hidden device times": {
                k: with_device_times(p, hidden[k]) if k in hidden else p for k, p in plain.items()
            }
            if plain_first
            else hidden,
        }
        compared = {name: comparisons(repredicted(run, ps)) for name, ps in sets.items()}
        for name, comps in compared.items():
            print(" " + line(name, summary(comps)))
        before, after = compared["plain profiles "], list(compared.values())[-1]
        moved = sorted(
            zip(before, after, strict=True), key=lambda ba: -abs(ba[1].error - ba[0].error)
        )
        print(" the most moved, plain -> the last set:")
        for b, a in moved[:12]:
            print(f"  {b.error:+7.1%} -> {a.error:+7.1%}  {b.label}")


if __name__ == "__main__":
    main()
