"""The model zoo: each model is an ordered list of blocks (nn.Sequential)."""

from pipecast.models.registry import ZOO, build_zoo_model, get_entry, model_names
from pipecast.models.summary import BlockSummary, summarize
from pipecast.models.user import as_sequential, load_factory_model
from pipecast.models.workload import Workload

__all__ = [
    "ZOO",
    "BlockSummary",
    "Workload",
    "as_sequential",
    "build_zoo_model",
    "get_entry",
    "load_factory_model",
    "model_names",
    "summarize",
]
