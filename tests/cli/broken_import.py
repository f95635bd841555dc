"""A module that fails as it is imported (--model tests.cli.broken_import:model)."""

raise ValueError("this module cannot be imported")
