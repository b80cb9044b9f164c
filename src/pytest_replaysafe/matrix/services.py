"""Finding PostgreSQL and Redis for tests: environment first, then Docker via testcontainers, else skip.

- ``REPLAYSAFE_PG_DSN`` / ``REPLAYSAFE_REDIS_URL`` name running services;
- otherwise, when a Docker engine answers, containers are started with testcontainers (once per session);
- otherwise tests that need the service are skipped with a reason saying how to enable them, or fail when
  ``REPLAYSAFE_REQUIRE_SERVICES=1`` (CI sets it, so a missing service can never pass silently).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

ENV_PG = "REPLAYSAFE_PG_DSN"
ENV_REDIS = "REPLAYSAFE_REDIS_URL"
ENV_REQUIRE = "REPLAYSAFE_REQUIRE_SERVICES"


#: ``pg-checkpoint`` (not ``pg_checkpoint``): the spelling every pip resolves; pip 23.2, which Python 3.11 ships,
#: does not normalise a requested extra and answers "does not provide the extra 'pg_checkpoint'".
DRIVER_HINT = (
    'pip install ".[pg-checkpoint]" in a tenxgraph checkout (or "tenxgraph[pg-checkpoint] @ <its path, URL or wheel>")'
)


def services_required() -> bool:
    return os.environ.get(ENV_REQUIRE, "").strip().lower() in {"1", "true", "yes"}


def unavailable(service: str, reason: str) -> None:
    """Skip (or, with REPLAYSAFE_REQUIRE_SERVICES=1, fail) the current test for a missing service."""
    env = ENV_PG if service == "PostgreSQL" else ENV_REDIS
    message = (
        f"{service} is not available ({reason}). Set {env} to a running server, or run a Docker engine so "
        f"testcontainers can start one."
    )
    if services_required():
        pytest.fail(f"{message} {ENV_REQUIRE}=1 makes this a failure.", pytrace=False)
    pytest.skip(message)


def address_or_skip(service: Service, name: str) -> str:
    """The service's address, or skip/fail (see :func:`unavailable`) when it has none."""
    if service.address is None:
        unavailable(name, service.reason)
    assert service.address is not None
    return service.address


def docker_available() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


@dataclass
class Service:
    """A resolved service address, and how to stop what we started for it."""

    address: str | None
    reason: str = ""
    stop: Callable[[], None] = field(default=lambda: None)


def start_postgres() -> Service:
    dsn = os.environ.get(ENV_PG)
    if dsn:
        return _checked(Service(dsn), _ping_postgres)
    if not docker_available():
        return Service(None, f"{ENV_PG} is not set and no Docker engine answers")
    from testcontainers.postgres import PostgresContainer

    container = PostgresContainer("postgres:16-alpine", driver=None)
    container.start()
    return _checked(Service(container.get_connection_url(), stop=container.stop), _ping_postgres)


def start_redis() -> Service:
    url = os.environ.get(ENV_REDIS)
    if url:
        return _checked(Service(url), _ping_redis)
    if not docker_available():
        return Service(None, f"{ENV_REDIS} is not set and no Docker engine answers")
    from testcontainers.redis import RedisContainer

    container = RedisContainer("redis:7-alpine")
    container.start()
    host, port = container.get_container_host_ip(), container.get_exposed_port(6379)
    return _checked(Service(f"redis://{host}:{port}/0", stop=container.stop), _ping_redis)


def _checked(service: Service, ping: Callable[[str], None]) -> Service:
    assert service.address is not None
    try:
        ping(service.address)
    except ImportError as exc:  # a missing driver is not a server that is down
        service.stop()
        return Service(None, f"its driver is not installed ({exc.name or exc}): {DRIVER_HINT}")
    except Exception as exc:
        service.stop()
        return Service(None, f"{service.address} did not answer: {type(exc).__name__}: {exc}")
    return service


def _ping_postgres(dsn: str) -> None:
    import psycopg

    with psycopg.connect(dsn, connect_timeout=5) as conn:
        conn.execute("SELECT 1")


def _ping_redis(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        client.ping()
    finally:
        client.close()


def new_schema_name(prefix: str = "rs") -> str:
    """A unique schema name for one test (so xdist workers never share tables)."""
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def drop_schema(dsn: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def delete_redis_keys(url: str, prefix: str) -> int:
    """Delete the keys under *prefix* (a test's own), never anything else; returns how many."""
    import redis

    if not prefix or "*" in prefix:
        raise ValueError(f"refusing to delete Redis keys under {prefix!r}: give a test's own, literal prefix")
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=prefix + "*", count=500))
        return int(client.delete(*keys)) if keys else 0
    finally:
        client.close()
