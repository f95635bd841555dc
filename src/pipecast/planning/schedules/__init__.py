"""Schedule generators: pure functions from (ranks, micro-batches) to a Plan."""

from pipecast.planning.schedules.generators import SCHEDULES, make_plan, stages_per_rank

__all__ = ["SCHEDULES", "make_plan", "stages_per_rank"]
