from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tenxgraph.core import crashpoints
from tenxgraph.storage.checkpointer import BaseCheckpointer, InMemoryCheckpointer, SqliteCheckpointer


@pytest.fixture(autouse=True)
def _disarm_crash_points() -> Iterator[None]:
    crashpoints.reset()
    yield
    crashpoints.reset()


@pytest.fixture(params=["memory", "sqlite"])
def checkpointer(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BaseCheckpointer]:
    """The embedded backends (PostgreSQL runs its own copies of these tests)."""
    if request.param == "memory":
        yield InMemoryCheckpointer()
        return
    cp = SqliteCheckpointer(tmp_path / "state.db")
    yield cp
    cp.close()
