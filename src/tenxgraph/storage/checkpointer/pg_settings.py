"""PgCheckpointer's tuning settings (``PgCheckpointer(dsn, retries=0, run_lease=2.0)``): their names, types,
defaults and checks, in one place. Each bad value is a :class:`ConfigError` naming the setting and what it takes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypedDict

from tenxgraph.storage.checkpointer.pg_lease import DEFAULT_LEASE_S
from tenxgraph.utils.errors import ConfigError


class PgSettingsArgs(TypedDict, total=False):
    """The keyword arguments :class:`PgSettings` accepts (each optional)."""

    cache_ttl: int
    max_pool_size: int
    pool_max_idle: float
    retries: int
    connect_timeout: float
    auto_setup: bool
    run_lease: float


@dataclass(frozen=True, slots=True)
class PgSettings:
    #: Seconds a cached state lives in Redis (0: no expiry).
    cache_ttl: int = 3600
    #: Connections in the pool (a run holds one for its run lock).
    max_pool_size: int = 10
    #: Seconds a connection beyond the first may sit idle in the pool before it is closed (psycopg_pool's
    #: ``max_idle``; the pool shrinks by one such connection per period): lower it where bursts are short.
    pool_max_idle: float = 600.0
    #: More attempts after a transient failure (see :mod:`.pg_connect`).
    retries: int = 3
    #: Seconds to wait for a connection, per attempt.
    connect_timeout: float = 5.0
    #: Create or migrate the schema on first use (else call ``setup()``).
    auto_setup: bool = True
    #: How long a run's lease on its thread lasts without renewal (see :mod:`.pg_lease`).
    run_lease: float = DEFAULT_LEASE_S

    @classmethod
    def of(cls, args: PgSettingsArgs) -> PgSettings:
        unknown = sorted(set(args) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigError(
                f"PgCheckpointer got unknown setting(s) {', '.join(unknown)}; settings: "
                f"{', '.join(cls.__dataclass_fields__)}"
            )
        settings = cls(**args)
        settings.check()
        return settings

    def check(self) -> None:
        retries, timeout, lease, ttl = self.retries, self.connect_timeout, self.run_lease, self.cache_ttl
        size, idle = self.max_pool_size, self.pool_max_idle
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"max_pool_size must be a whole number >= 1, got {size!r}")
        if isinstance(idle, bool) or not isinstance(idle, int | float) or idle <= 0:
            raise ConfigError(f"pool_max_idle must be a number of seconds > 0, got {idle!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigError(f"retries must be a whole number >= 0, got {retries!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigError(f"connect_timeout must be a number of seconds > 0, got {timeout!r}")
        if isinstance(lease, bool) or not isinstance(lease, int | float) or not 0.05 <= lease <= 3600:
            raise ConfigError(f"run_lease must be a number of seconds between 0.05 and 3600, got {lease!r}")
        if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 0:
            raise ConfigError(f"cache_ttl must be a whole number of seconds >= 0 (0 = no expiry), got {ttl!r}")


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def validate_identifier(name: str, what: str = "schema") -> str:
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise ConfigError(
            f"{what} {name!r} is not a valid PostgreSQL identifier: use 1-63 letters, digits or '_', "
            "not starting with a digit"
        )
    return name
