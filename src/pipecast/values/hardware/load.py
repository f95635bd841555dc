"""Where a `--cluster` argument points: a preset name, a probe's JSON, or a short description."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipecast import jsonio
from pipecast.errors import DataError
from pipecast.values.hardware.cluster import Cluster, cluster_from_dict
from pipecast.values.hardware.presets import PRESETS, gpu_kind, preset


def load_cluster(arg: str) -> Cluster:
    """A preset (`h100-nvlink`, `dgx-h100`, `h100-superpod`...), or a JSON file: a probe's
    output (kind 'cluster') or a user's description such as {"gpus_per_node": 4, "memory":
    "80GiB", "intra": {"bandwidth": "150GB/s", "latency": "10us"}, "nodes": 2, "inter":
    {"bandwidth": "50GB/s"}}, or a preset changed where a description says otherwise
    ({"preset": "h100-superpod", "oversubscription": 2})."""
    if arg in PRESETS:
        return preset(arg)
    if not Path(arg).exists():
        raise DataError(
            f"cluster '{arg}' is neither a file nor a preset ({', '.join(PRESETS)}): run "
            "`pipecast probe -o cluster.json` or describe the machine in a JSON file"
        )
    text = jsonio.read_text(arg)
    doc = jsonio.parse(text, arg)
    if isinstance(doc, dict) and doc.get("kind") == "cluster":
        return Cluster.from_json(text, source=arg)
    if not isinstance(doc, dict) or "kind" in doc:  # a description has no kind
        raise DataError(
            f"{arg} holds {jsonio.describe(doc)}, not a cluster: pass a probe's output or a "
            "JSON object describing the machine"
        )
    if "preset" in doc:
        return from_preset(doc, source=arg)
    return cluster_from_dict(doc, source=arg)


def from_preset(doc: dict[str, Any], source: str = "<dict>") -> Cluster:
    """The preset `doc` names with every other figure `doc` gives in place of the preset's
    (the network given as one NIC replaces the preset's inter link)."""
    base = json.loads(preset(str(doc["preset"])).to_json())
    if "nic" in doc:
        base.pop("inter")
    if "memory" in doc:
        base.pop("memory_bytes")
    return cluster_from_dict({**base, **{k: v for k, v in doc.items() if k != "preset"}}, source)


def default_cluster(device_name: str, gpus: int) -> Cluster:
    """A preset matching the device a profile was measured on, sized to `gpus`."""
    kind = gpu_kind(device_name)
    base = preset(f"{kind}-nvlink" if kind else "cpu")
    fits = 0 < gpus <= base.gpus_per_node or (gpus > 0 and gpus % base.gpus_per_node == 0)
    return base.subset(gpus) if fits else base
