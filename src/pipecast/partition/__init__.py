"""Partitions: the type, and pure algorithms that compute one from a Profile and a Cluster."""

from pipecast.partition.methods import METHODS, Setting, partition
from pipecast.partition.pipedream import pipedream_partition
from pipecast.partition.report import PartitionReport, analyze, efficiency
from pipecast.partition.types import Partition, Placement, Stage, from_boundaries

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
