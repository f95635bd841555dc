"""How much slower CPU ranks compute when they share this machine's cores: the probe's
readings (pipecast.measuring.probe.host_probe) against what sharing must do to them.

    python -m benchmarks.host_sharing        # on an idle machine: about 10 s on 2 cores

- `cpu_compute`: one rank with every core computes a fixed matmul about as fast as this
  process does (factor under 3), and two ranks, each with half the cores, slower than one.
- `shared_compute`: twice as many ranks as cores, each with one thread, take turns: the
  model's step in each runs well over its time alone (2x in theory; over 1.2 read).

These are facts of the machine, true only while nothing else runs on it, so they are a
benchmark and not tests: on a busy machine the readings alone and together are taken under
different loads. It prints each reading and exits 1 where one is not as stated.
"""

from __future__ import annotations

import os
import sys

from pipecast.measuring.probe.host_probe import cpu_compute, shared_compute
from pipecast.values.models import Workload


def main() -> int:
    cores = os.cpu_count() or 1
    factors = cpu_compute([1, 2])
    print(f"cpu_compute on {cores} cores: 1 rank {factors[1]:.2f}x, 2 ranks {factors[2]:.2f}x")
    ok = factors[1] < 3.0 and factors[2] > factors[1]
    n = 2 * cores
    if cores <= 4:  # more would take too many processes
        shared = shared_compute(Workload(model="lenet5", dataset="mnist"), [n], 256 * n)
        print(f"shared_compute: {n} ranks of one thread on {cores} cores, {shared[n]:.2f}x")
        ok = ok and shared[n] > 1.2
    print("as stated" if ok else "NOT as stated: is the machine idle?")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
