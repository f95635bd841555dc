"""Models as pipecast sees them: an ordered list of blocks (nn.Sequential), from the zoo,
a user's factory, torchvision, timm or Hugging Face (captured by pipecast.values.models.capture)."""

from pipecast.values.models.registry import ZOO, build_zoo_model, get_entry, model_names
from pipecast.values.models.sources import build_source_model, default_dataset, is_source_path
from pipecast.values.models.summary import BlockSummary, summarize
from pipecast.values.models.user import as_sequential
from pipecast.values.models.workload import Workload

__all__ = [
    "ZOO",
    "BlockSummary",
    "Workload",
    "as_sequential",
    "build_source_model",
    "build_zoo_model",
    "default_dataset",
    "get_entry",
    "is_source_path",
    "model_names",
    "summarize",
]
