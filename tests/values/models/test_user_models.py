from __future__ import annotations

import pytest
from torch import nn

from pipecast.errors import ConfigError
from pipecast.values.models import Workload, as_sequential


def test_factory_with_spec() -> None:
    model = Workload(model="tests.user_models:tiny_mlp", dataset="mnist").build()
    assert isinstance(model, nn.Sequential) and len(model) == 4


def test_factory_returning_list_is_wrapped() -> None:
    assert len(Workload(model="tests.user_models:tiny_list", dataset="mnist").build()) == 2


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.user_models:not_a_model", "must be an nn.Sequential"),
        ("tests.user_models:missing", "has no callable 'missing'"),
        ("no_such_module_xyz:f", "cannot import"),
        ("tests.user_models:", "package.module:factory"),
    ],
)
def test_bad_factories(path: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Workload(model=path, dataset="mnist").build()


def test_as_sequential_rejects_non_modules() -> None:
    with pytest.raises(ConfigError):
        as_sequential([1, 2])
    assert isinstance(as_sequential([nn.ReLU()]), nn.Sequential)


def test_a_factory_that_raises_is_one_line_naming_it_and_the_exception() -> None:
    path = "tests.cli.broken_models:raises"
    with pytest.raises(ConfigError) as caught:
        Workload(model=path, dataset="mnist").build()
    message = str(caught.value)
    assert message == f"the model factory {path} raised RuntimeError: no weights for mnist"


def test_a_module_that_fails_to_import_is_named_with_the_exception() -> None:
    with pytest.raises(ConfigError, match="raised ValueError: this module cannot be imported"):
        Workload(model="tests.cli.broken_import:model", dataset="mnist").build()
