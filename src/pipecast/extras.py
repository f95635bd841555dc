"""Optional packages (the extras in pyproject.toml): imported where a feature needs one, or a
one-line error naming the feature and how to install the package."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from pipecast.errors import ConfigError


def require(package: str, *, needed_by: str, install: str) -> ModuleType:
    """`package`, imported; else a ConfigError saying `needed_by` needs it and `install`.
    Any failure counts, not only a missing package: a wheel built for another torch fails
    at import too."""
    try:
        return importlib.import_module(package)
    except Exception as exc:
        raise ConfigError(
            f"{needed_by} needs {package}, which cannot be imported here "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:120]}): {install}"
        ) from None


def check_installed(package: str, *, needed_by: str, install: str) -> None:
    """Before any work starts: `package` is there to import later (it is not imported)."""
    if importlib.util.find_spec(package) is None:
        raise ConfigError(f"{needed_by}: {package} is not installed ({install})")
