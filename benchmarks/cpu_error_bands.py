"""How far off CPU step-time predictions fall: the 10th and 90th percentiles of (predicted -
measured) / measured over every strategy `pipecast recommend --validate` measured on CPU
ranks (results/cpu2-validate/*.json, each a recommendation written on the 2-core machine
with its validation). pipecast.recommend.predict.CPU_ERROR_RANGE is this rounded outward to
whole per cents (CPU only, instant):

    cd benchmarks && python3 cpu_error_bands.py > results/cpu-error-bands.txt

The recommendations themselves, on the 2-core machine, 4 CPU ranks (torch 2.13.0+cpu; -o
results/cpu2-validate/<model>-b<batch>-validate<K>.json):
    pipecast recommend --validate 5 --rounds 2        (ResNet-18/CIFAR-10, batch 32)
    pipecast recommend --validate 9 --rounds 1        (the same, again)
    pipecast recommend --model mobilenetv2 --dataset cifar10 --batch 32 --validate 8 --rounds 2
    pipecast recommend --model lenet5 --dataset mnist --batch 64 --validate 8 --rounds 2
    pipecast recommend --model vgg11 --dataset cifar10 --batch 32 --validate 8 --rounds 2
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "cpu2-validate"


def main() -> None:
    errors: list[float] = []
    for path in sorted(RESULTS.glob("*.json")):
        doc = json.loads(path.read_text())
        rows = doc.get("validation") or []
        predicted_fastest = doc["ranked"][0]["label"]
        fastest = min(rows, key=lambda r: r["measured"])["label"] if rows else None
        errors += [r["error"] for r in rows]
        print(
            f"{path.name}: {len(rows)} strategies measured, errors "
            + " ".join(f"{r['error']:+.1%}" for r in rows)
            + f"; predicted fastest {predicted_fastest}, measured fastest {fastest}"
        )
    deciles = statistics.quantiles(errors, n=10, method="inclusive")
    low, high = deciles[0], deciles[-1]
    print(
        f"all: {len(errors)} measurements, median {statistics.median(errors):+.1%}, 10th "
        f"percentile {low:+.1%}, 90th {high:+.1%}, worst |error| "
        f"{max(abs(e) for e in errors):.1%}; CPU_ERROR_RANGE "
        f"{math.floor(low * 100) / 100:+.2f}, {math.ceil(high * 100) / 100:+.2f}"
    )


if __name__ == "__main__":
    main()
