"""Where each process sits in a job's mesh: data-parallel replica (outermost), pipeline rank,
tensor-parallel rank (innermost).

    global rank = (replica x pipeline ranks + pipeline rank) x tp + tensor-parallel rank

the order torch's init_device_mesh gives a (replicas, pipeline ranks, tp) mesh, so the
runtime's own groups (transfers, all-reduces, ties) and torch's sub-meshes name the same
processes. Without tensor parallelism this is the runtime's older numbering, replica-major.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    replicas: int
    width: int
    """Pipeline ranks per replica."""
    tp: int = 1
    """Tensor-parallel ranks per pipeline rank."""

    @property
    def world(self) -> int:
        return self.replicas * self.width * self.tp

    def rank(self, replica: int, pipeline_rank: int, tensor: int = 0) -> int:
        """The global rank of one place in the mesh."""
        return (replica * self.width + pipeline_rank) * self.tp + tensor

    def place(self, global_rank: int) -> tuple[int, int, int]:
        """(replica, pipeline rank, tensor-parallel rank) of `global_rank`."""
        slot, tensor = divmod(global_rank, self.tp)
        replica, pipeline_rank = divmod(slot, self.width)
        return replica, pipeline_rank, tensor
