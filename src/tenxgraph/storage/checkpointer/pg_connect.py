"""How PgCheckpointer connects and what it retries: one place for the failure rules.

- A malformed DSN or Redis URL is a :class:`ConfigError` at construction.
- Before the pool opens, one direct connection is made with ``connect_timeout``: a server that refuses (bad role,
  password or database) fails at once with the server's own reason; a server that does not answer is retried.
- Only transient errors are retried (a dropped or refused connection, an admin shutdown, too many connections,
  a serialization failure or deadlock): never a statement the server rejected (a value over an index limit, bad
  data), which would fail the same way again.
- Retry budget: ``retries`` more attempts, each waiting up to ``connect_timeout`` for a connection, with a back-off
  of 0.05 s x4 per attempt up to 1 s: with the defaults (3, 5 s) about 4 x 5 s + 1.05 s = 21 s before a run fails.
"""

from __future__ import annotations

import asyncio
import math
from urllib.parse import urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import PoolTimeout

from tenxgraph.utils.backoff import Backoff
from tenxgraph.utils.errors import ConfigError, StorageConnectionError

#: SQLSTATEs worth another attempt: connection exceptions (class 08), admin/crash shutdown, too many connections,
#: serialization failure, deadlock.
_TRANSIENT = frozenset({"57P01", "57P02", "57P03", "53300", "40001", "40P01"})
#: Between attempts after a transient failure: 0.05 s, x4 each time, at most 1 s.
RETRY_BACKOFF = Backoff(0.05, 4.0, 1.0)


#: A connection the server refused with FATAL is permanent (bad role, password, database, pg_hba) unless it says
#: the server is busy or changing state. psycopg gives connection failures no SQLSTATE, only the server's text.
_FATAL_BUT_TRANSIENT = ("starting up", "shutting down", "in recovery", "too many clients", "connection slots")


def is_transient(exc: BaseException) -> bool:
    """Whether another attempt may succeed."""
    if isinstance(exc, PoolTimeout):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    if state is not None:
        return state.startswith("08") or state in _TRANSIENT
    text = str(exc)
    return "FATAL:" not in text or any(phrase in text for phrase in _FATAL_BUT_TRANSIENT)


def is_connection_lost(exc: BaseException) -> bool:
    """Whether the failure took the connection with it (not a serialization failure or a deadlock)."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")


def check_dsn(dsn: str) -> None:
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(f"postgres_dsn is not a valid connection string or URL: {exc}") from None


def check_redis_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix") or not (parts.hostname or parts.path):
        raise ConfigError(
            f"redis_url {url!r} is not a Redis URL; use redis://host:6379/0, rediss://... (TLS) or unix:///path"
        )


def where(dsn: str) -> str:
    """host:port/dbname of a DSN, without credentials, for error messages."""
    info = conninfo_to_dict(dsn)
    return f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', info.get('user', ''))}"


def server_reason(exc: BaseException) -> str:
    """libpq's message on one line: every line of it (the reason, "Connection refused", and its hint), without the
    tabs and the repeated "connection failed:" prefix."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = "; ".join(lines).removeprefix("connection failed: ")
    return text or type(exc).__name__


async def probe(dsn: str, connect_timeout: float, retries: int) -> None:
    """Connect once (retrying only transient failures) and close; raise :class:`StorageConnectionError` with the
    server's reason otherwise."""
    delays = RETRY_BACKOFF.delays()
    for attempt in range(retries + 1):
        try:
            conn = await psycopg.AsyncConnection.connect(dsn, connect_timeout=max(1, math.ceil(connect_timeout)))
        except psycopg.OperationalError as exc:
            reason = server_reason(exc)
            if not is_transient(exc):
                raise StorageConnectionError(
                    f"PostgreSQL at {where(dsn)} refused the connection: {reason} (not retried: check the DSN's "
                    "user, password and database)"
                ) from exc
            if attempt == retries:
                raise StorageConnectionError(
                    f"could not connect to PostgreSQL at {where(dsn)} in {retries + 1} attempt{'s' if retries else ''} "
                    f"(connect_timeout={connect_timeout:g}s, retries={retries}): {reason}"
                ) from exc
            await asyncio.sleep(next(delays))
        else:
            await conn.close()
            return
