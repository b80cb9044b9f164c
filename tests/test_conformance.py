"""The shared checkpointer contract, run against every backend."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
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

    @pytest.fixture
    def second_worker(self, checkpointer: SqliteCheckpointer) -> Iterator[SqliteCheckpointer]:
        cp = SqliteCheckpointer(checkpointer.path)
        yield cp
        cp.close()

    @pytest.fixture
    def blip(self) -> Any:
        def remove_lock_file(checkpointer: SqliteCheckpointer, thread_id: str) -> None:
            os.unlink(f"{checkpointer.path}.lock")  # (a cleanup job, a user's rm)

        return remove_lock_file


class TestPostgres(CheckpointerConformance):
    lease_s = 0.3

    @pytest.fixture
    def checkpointer(self, pg_dsn: str, pg_schema: str) -> Iterator[PgCheckpointer]:
        cp = PgCheckpointer(postgres_dsn=pg_dsn, schema=pg_schema, run_lease=self.lease_s)
        yield cp
        cp.close()

    @pytest.fixture
    def second_worker(self, checkpointer: PgCheckpointer, pg_dsn: str) -> Iterator[PgCheckpointer]:
        cp = PgCheckpointer(postgres_dsn=pg_dsn, schema=checkpointer.schema, run_lease=self.lease_s)
        yield cp
        cp.close()

    @pytest.fixture
    def blip(self, pg_dsn: str) -> Any:
        def drop_lock_connection(checkpointer: PgCheckpointer, thread_id: str) -> None:
            key = checkpointer.run_lock_key(thread_id)
            with psycopg.connect(pg_dsn, autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted AND "
                    "classid = %s::oid AND objid = %s::oid AND objsubid = 1",
                    (key >> 32 & 0xFFFFFFFF, key & 0xFFFFFFFF),
                )

        return drop_lock_connection


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
