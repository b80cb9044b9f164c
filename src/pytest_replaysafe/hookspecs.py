"""Hooks a conftest or plugin can implement to extend the crash matrix."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_replaysafe.judge.gaps import GapRule
    from pytest_replaysafe.matrix.cells import Backend


@pytest.hookspec
def pytest_replaysafe_add_backends(config: pytest.Config) -> list[Backend]:
    """Return extra backends (your own checkpointer) for the matrix::

    def pytest_replaysafe_add_backends(config):
        return [Backend("mystore", lambda request: MyCheckpointer(...), durable=True)]
    """
    raise NotImplementedError


@pytest.hookspec
def pytest_replaysafe_add_gaps(config: pytest.Config) -> list[GapRule]:
    """Return extra known gaps (for example, of your own checkpointer)."""
    raise NotImplementedError
