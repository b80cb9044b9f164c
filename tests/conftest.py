from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


_REDIS_KEYS_AT_START = pytest.StashKey[set[bytes]]()


def _tenxgraph_redis_keys() -> set[bytes] | None:
    """Every ``tenxgraph:*`` key in the Redis the tests use (None: no Redis configured or reachable)."""
    url = os.environ.get("REPLAYSAFE_REDIS_URL")
    if not url:
        return None
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    try:
        return set(client.scan_iter(match="tenxgraph:*", count=1000))
    except redis.RedisError:
        return None
    finally:
        client.close()


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # (the xdist controller, or a run without xdist)
        keys = _tenxgraph_redis_keys()
        if keys is not None:
            session.config.stash[_REDIS_KEYS_AT_START] = keys


def pytest_sessionfinish(session: pytest.Session, exitstatus: Any) -> None:
    """The suite deletes every Redis key it writes: a user's ``make test`` leaves nothing in their Redis."""
    before = session.config.stash.get(_REDIS_KEYS_AT_START, None)
    after = _tenxgraph_redis_keys() if before is not None else None
    left = sorted(after - before) if before is not None and after is not None else []
    if left:
        shown = ", ".join(k.decode() for k in left[:5])
        print(f"\nthe test session left {len(left)} Redis key(s) behind: {shown} (delete what a test writes)")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Skipped tests, one line per reason (pytest's ``-rs`` prints a line per test location: 132 lines without
    services, most of them the same reason)."""
    reasons: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        if getattr(report, "wasxfail", None) is not None:
            continue  # (an xfail is not a skip)
        longrepr = report.longrepr
        reason = str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    if reasons:
        terminalreporter.section("skipped, by reason")
        for reason, n in sorted(reasons.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{n:4} {reason}")


@pytest.fixture(autouse=True)
def _pytester_keeps_addopts(request: pytest.FixtureRequest) -> None:
    """Pytester clears ``PYTEST_ADDOPTS`` for the runs it starts; the suite's own (``make test`` turns off the
    langsmith plugin that langgraph brings, 1-3 s a pytest start) reaches them again."""
    addopts = os.environ.get("PYTEST_ADDOPTS")
    if addopts and "pytester" in request.fixturenames:
        request.getfixturevalue("pytester")
        request.getfixturevalue("monkeypatch").setenv("PYTEST_ADDOPTS", addopts)
