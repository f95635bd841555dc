"""Shared by the GPU benchmark scripts: output folder, logging, time budget, JSON."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

START = time.time()
OUT = Path(os.environ.get("OUT") or ROOT / "benchmarks" / "results" / "local")
OUT.mkdir(parents=True, exist_ok=True)


def log(message: str) -> None:
    line = f"[{time.time() - START:6.1f}s] {message}"
    print(line, flush=True)
    with open(OUT / "log.txt", "a") as fh:
        fh.write(line + "\n")


def dump(name: str, data: Any) -> None:
    (OUT / name).write_text(json.dumps(data, indent=1, default=str))


def left(budget_s: float) -> float:
    return budget_s - (time.time() - START)
