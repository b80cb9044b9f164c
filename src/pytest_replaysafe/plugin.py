"""pytest-replaysafe: fixtures for replay-safety tests (the crash matrix builds on them).

Registered through the ``pytest11`` entry point ``replaysafe``. Heavy imports happen inside fixtures.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from pytest_replaysafe import services

if TYPE_CHECKING:
    from tenxgraph.storage.checkpointer.pg import PgCheckpointer


@pytest.fixture(scope="session")
def _replaysafe_pg() -> Iterator[services.Service]:
    service = services.start_postgres()
    yield service
    service.stop()


@pytest.fixture(scope="session")
def _replaysafe_redis() -> Iterator[services.Service]:
    service = services.start_redis()
    yield service
    service.stop()


@pytest.fixture
def pg_dsn(_replaysafe_pg: services.Service) -> str:
    """A PostgreSQL DSN (REPLAYSAFE_PG_DSN, or a testcontainers container); skips/fails when there is none."""
    if _replaysafe_pg.address is None:
        services.unavailable("PostgreSQL", _replaysafe_pg.reason)
    assert _replaysafe_pg.address is not None
    return _replaysafe_pg.address


@pytest.fixture
def redis_url(_replaysafe_redis: services.Service) -> str:
    """A Redis URL (REPLAYSAFE_REDIS_URL, or a testcontainers container); skips/fails when there is none."""
    if _replaysafe_redis.address is None:
        services.unavailable("Redis", _replaysafe_redis.reason)
    assert _replaysafe_redis.address is not None
    return _replaysafe_redis.address


@pytest.fixture
def pg_schema(pg_dsn: str) -> Iterator[str]:
    """A fresh schema name for this test, dropped afterwards (tests can run in parallel)."""
    schema = services.new_schema_name()
    yield schema
    services.drop_schema(pg_dsn, schema)


@pytest.fixture
def pg_checkpointer(pg_dsn: str, pg_schema: str) -> Iterator[PgCheckpointer]:
    """A PgCheckpointer without cache, on an isolated schema."""
    from tenxgraph.storage.checkpointer.pg import PgCheckpointer

    cp = PgCheckpointer(postgres_dsn=pg_dsn, schema=pg_schema)
    yield cp
    cp.close()


@pytest.fixture
def pg_redis_checkpointer(pg_dsn: str, redis_url: str, pg_schema: str) -> Iterator[PgCheckpointer]:
    """A PgCheckpointer with the Redis cache, on an isolated schema (and cache key prefix)."""
    from tenxgraph.storage.checkpointer.pg import PgCheckpointer

    cp = PgCheckpointer(postgres_dsn=pg_dsn, redis_url=redis_url, schema=pg_schema)
    yield cp
    cp.close()
