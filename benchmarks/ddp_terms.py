"""Re-predict stored runs with torch DDP's host terms as the probe read them on another
4 x H100 machine (results/h100x4-ddp-probe, the two probes averaged). The stored profiles
predate the tensor counts: they get them from the zoo's block structure. Prints, for each
run, the accuracy summary and every DDP row's error, without the terms and with them.

    cd benchmarks && python3 ddp_terms.py results/h100x4-run1 results/h200x2-run2 ...
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import common  # noqa: F401  (puts src/ on the path)
from combine import repredicted, run_profiles

from pipecast.bench.accuracy import comparisons, summary
from pipecast.hardware.cluster import Cluster
from pipecast.models.workload import Workload
from pipecast.profile.types import Profile

PROBES = Path(__file__).parent / "results" / "h100x4-ddp-probe"
KEYS = ("ddp_step_host", "ddp_param_host", "ddp_buffer_host")


def probed_terms() -> dict[str, float]:
    docs = [json.loads(p.read_text()) for p in sorted(PROBES.glob("cluster*.json"))]
    return {k: statistics.mean(float(d[k]) for d in docs) for k in KEYS}


def counted(profile: Profile) -> Profile:
    """The profile with each block's parameter and buffer tensors counted."""
    blocks = list(Workload.from_dict(profile.workload).build("meta"))
    return replace(
        profile,
        blocks=tuple(
            replace(
                b,
                param_tensors=sum(1 for p in m.parameters() if p.requires_grad),
                buffer_tensors=sum(1 for _ in m.buffers()),
            )
            for b, m in zip(profile.blocks, blocks, strict=True)
        ),
    )


def main() -> None:
    terms = probed_terms()
    print({k: f"{v * 1e6:.1f} us" for k, v in terms.items()})
    for arg in sys.argv[1:]:
        run = Path(arg)
        profiles = {k: counted(p) for k, p in run_profiles(run).items()}
        cluster = Cluster.load(str(run / "cluster.json"))
        for name, c in (("without", cluster), ("with", replace(cluster, **terms))):
            comps = comparisons(repredicted(run, profiles, c))
            s = summary(comps)
            ddp = " ".join(f"{x.label}: {x.error:+.0%};" for x in comps if " DDP " in x.label)
            print(
                f"{run.name} {name}: median {s['median_abs_error']:.1%}, worst "
                f"{s['worst_abs_error']:.1%}, {s['within_20_percent']} within 20%, picks "
                f"{s['right']}/{s['decisions']} | {ddp}"
            )


if __name__ == "__main__":
    main()
