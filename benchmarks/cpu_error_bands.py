"""How far off CPU step-time predictions fall: every strategy `pipecast recommend --validate`
measured on CPU ranks of the 2-core machine (results/cpu2-validate/*-validate*.json),
re-predicted by this checkout's code from the profiles the recommendations came from
(profile_<model>.json) and the machine's probe (cluster.json, probed after the runs, with the
runtime's own work per action and per step). Prints each recommendation's errors and
whether the predicted fastest of what was measured is the measured fastest, then the 10th
and 90th percentiles of (predicted - measured) / measured:
pipecast.recommend.predict.CPU_ERROR_RANGE is that rounded outward to whole per cents (CPU
only, seconds):

    cd benchmarks && python3 cpu_error_bands.py > results/cpu-error-bands.txt

The recommendations themselves, on the 2-core machine, 4 CPU ranks (torch 2.13.0+cpu; -o
results/cpu2-validate/<model>-b<batch>-validate<K>.json):
    pipecast recommend --validate 5 --rounds 2        (ResNet-18/CIFAR-10, batch 32)
    pipecast recommend --validate 9 --rounds 1        (the same, again)
    pipecast recommend --model mobilenetv2 --dataset cifar10 --batch 32 --validate 8 --rounds 2
    pipecast recommend --model lenet5 --dataset mnist --batch 64 --validate 8 --rounds 2
    pipecast recommend --model vgg11 --dataset cifar10 --batch 32 --validate 8 --rounds 2
    pipecast recommend --model vgg11 --dataset cifar10 --batch 32 --validate 5 --rounds 2
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import common  # noqa: F401  (puts src/ on the path)

from pipecast.hardware.cluster import Cluster
from pipecast.profile.types import Profile
from pipecast.recommend.predict import predict
from pipecast.recommend.strategy import Strategy

RESULTS = Path(__file__).resolve().parent / "results" / "cpu2-validate"


def main() -> None:
    cluster = Cluster.load(str(RESULTS / "cluster.json"))
    errors: list[float] = []
    right = 0
    runs = sorted(RESULTS.glob("*-validate*.json"))
    for path in runs:
        doc = json.loads(path.read_text())
        profile = Profile.load(str(RESULTS / f"profile_{doc['workload']['model']}.json"))
        strategies = {r["label"]: Strategy.from_dict(r["strategy"]) for r in doc["ranked"]}
        predicted = {
            v["label"]: predict(
                profile, cluster, strategies[v["label"]], doc["batch"], optimizer=doc["optimizer"]
            ).step_time
            for v in doc["validation"]
        }
        measured = {v["label"]: v["measured"] for v in doc["validation"]}
        mine = [predicted[k] / measured[k] - 1 for k in measured]
        errors += mine
        pick = min(predicted, key=predicted.__getitem__)
        fastest = min(measured, key=measured.__getitem__)
        right += pick == fastest
        print(
            f"{path.name}: {len(mine)} strategies measured, errors "
            + " ".join(f"{e:+.1%}" for e in mine)
            + f"; predicted fastest {pick}, measured fastest {fastest}"
            + (f" ({measured[pick] / measured[fastest] - 1:+.1%})" if pick != fastest else "")
        )
    deciles = statistics.quantiles(errors, n=10, method="inclusive")
    low, high = deciles[0], deciles[-1]
    print(
        f"all: {len(errors)} measurements, median {statistics.median(errors):+.1%}, median "
        f"|error| {statistics.median(abs(e) for e in errors):.1%}, "
        f"{sum(abs(e) <= 0.2 for e in errors)} within 20%, worst |error| "
        f"{max(abs(e) for e in errors):.1%}; predicted fastest measured fastest in {right} of "
        f"{len(runs)}; 10th percentile {low:+.1%}, 90th {high:+.1%}; CPU_ERROR_RANGE "
        f"{math.floor(low * 100) / 100:+.2f}, {math.ceil(high * 100) / 100:+.2f}"
    )


if __name__ == "__main__":
    main()
