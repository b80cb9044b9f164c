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


@pytest.fixture(params=["memory", "sqlite", "postgres", "postgres+redis"])
def checkpointer(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BaseCheckpointer]:
    """Every backend; the PostgreSQL ones skip (or fail in CI) without a server."""
    if request.param == "memory":
        yield InMemoryCheckpointer()
    elif request.param == "sqlite":
        cp = SqliteCheckpointer(tmp_path / "state.db")
        yield cp
        cp.close()
    elif request.param == "postgres":
        yield request.getfixturevalue("pg_checkpointer")
    else:
        yield request.getfixturevalue("pg_redis_checkpointer")
