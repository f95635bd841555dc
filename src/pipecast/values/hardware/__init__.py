"""Hardware: the Cluster type, unit parsing, the link fit (pure) and the probe (measures)."""

from pipecast.values.hardware.cluster import Cluster, Link, cluster_from_dict
from pipecast.values.hardware.fit import fit_link

__all__ = ["Cluster", "Link", "cluster_from_dict", "fit_link"]
