"""Partitions: the type, and pure algorithms that compute one from a Profile and a Cluster."""

from pipecast.planning.partition.methods import METHODS, Setting, partition
from pipecast.planning.partition.pipedream import pipedream_partition
from pipecast.planning.partition.report import PartitionReport, analyze, efficiency
from pipecast.values.parallel import Placement
from pipecast.values.partition import Partition, Stage, from_boundaries

__all__ = [
    "METHODS",
    "Partition",
    "PartitionReport",
    "Placement",
    "Setting",
    "Stage",
    "analyze",
    "efficiency",
    "from_boundaries",
    "partition",
    "pipedream_partition",
]
