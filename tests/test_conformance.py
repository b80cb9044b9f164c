"""The shared checkpointer contract, run against every backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_replaysafe.conformance import CheckpointerConformance
from tenxgraph.storage.checkpointer import DelegatingCheckpointer, InMemoryCheckpointer, SqliteCheckpointer
from tenxgraph.storage.checkpointer.pg import PgCheckpointer


class TestInMemory(CheckpointerConformance):
    @pytest.fixture
    def checkpointer(self) -> InMemoryCheckpointer:
        return InMemoryCheckpointer()


class TestSqlite(CheckpointerConformance):
    @pytest.fixture
    def checkpointer(self, tmp_path: Path) -> Iterator[SqliteCheckpointer]:
        cp = SqliteCheckpointer(tmp_path / "state.db")
        yield cp
        cp.close()


class TestPostgres(CheckpointerConformance):
    @pytest.fixture
    def checkpointer(self, pg_checkpointer: PgCheckpointer) -> PgCheckpointer:
        return pg_checkpointer


class TestPostgresWithRedis(CheckpointerConformance):
    @pytest.fixture
    def checkpointer(self, pg_redis_checkpointer: PgCheckpointer) -> PgCheckpointer:
        return pg_redis_checkpointer


class TestDelegatingOverSqlite(CheckpointerConformance):
    """A wrapper forwards the whole contract (the harness and the test spies are built on it)."""

    @pytest.fixture
    def checkpointer(self, tmp_path: Path) -> Iterator[DelegatingCheckpointer]:
        cp = DelegatingCheckpointer(SqliteCheckpointer(tmp_path / "state.db"))
        yield cp
        cp.close()
