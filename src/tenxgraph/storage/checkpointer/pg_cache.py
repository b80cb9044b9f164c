"""The optional Redis cache of PgCheckpointer: the latest state of each thread, guarded by version.

PostgreSQL stays the source of truth: a run always resumes from PostgreSQL, and the cache is for readers (UIs).
Writes happen in the background, through a Lua script that refuses a version not newer than the cached one, so
out-of-order completion (or a stale run) can never regress the cache. Keys live under one prefix per schema.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from tenxgraph.storage.checkpointer.base import ThreadSnapshot
from tenxgraph.utils.constants import LOGGER_NAME, install_hint

if TYPE_CHECKING:
    import redis.asyncio as aioredis

log = logging.getLogger(LOGGER_NAME)

# Refuse a cache write unless it is newer than what the cache holds (a stale run cannot regress the cache).
_CACHE_PUT = """
local current = redis.call('HGET', KEYS[1], 'version')
if current and tonumber(current) >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'state', ARGV[2])
if tonumber(ARGV[3]) > 0 then redis.call('EXPIRE', KEYS[1], ARGV[3]) end
return 1
"""


def thread_key(prefix: str, thread_id: str) -> str:
    """The Redis hash holding a thread's cached state (fields ``version`` and ``state``)."""
    return f"{prefix}thread:{thread_id}"


class RedisStateCache:
    """One schema's cache: *url* (we own the client) or *client* (yours to close)."""

    def __init__(self, prefix: str, ttl: int, url: str | None = None, client: aioredis.Redis | None = None) -> None:
        self.prefix, self.ttl, self.url, self._user_client = prefix, ttl, url, client
        self._client: aioredis.Redis | None = client
        self._script: Any = None
        self._tasks: set[asyncio.Task[bool]] = set()

    def key(self, thread_id: str) -> str:
        return thread_key(self.prefix, thread_id)

    def forget_after_fork(self) -> None:
        """A forked child never uses the parent's sockets."""
        self._client, self._script, self._tasks = self._user_client if self.url is None else None, None, set()

    async def _connect(self) -> aioredis.Redis:
        if self._client is None:
            try:
                import redis.asyncio as aioredis
            except ImportError as exc:
                hint = install_hint("pg-checkpoint")
                raise ImportError(f"the Redis cache needs redis-py: {hint} ({exc})") from exc
            self._client = aioredis.from_url(
                self.url or "", socket_connect_timeout=0.5, socket_timeout=0.5, health_check_interval=30
            )
        if self._script is None:
            self._script = self._client.register_script(_CACHE_PUT)
        return self._client

    async def get(self, thread_id: str) -> ThreadSnapshot | None:
        """The cached state, or None when there is none or Redis fails (logged)."""
        try:
            data = await (await self._connect()).hgetall(self.key(thread_id))
        except Exception as exc:
            log.warning("Redis cache read for thread %r failed (%s); reading PostgreSQL", thread_id, exc)
            return None
        return ThreadSnapshot(thread_id, json.loads(data[b"state"]), int(data[b"version"])) if data else None

    async def put(self, thread_id: str, version: int, state_json: str) -> bool:
        """Write if *version* is newer than the cached one (atomic). False if refused or Redis is down."""
        try:
            client = await self._connect()
            written = await self._script(
                keys=[self.key(thread_id)], args=[version, state_json, self.ttl], client=client
            )
            return bool(written)
        except Exception as exc:
            log.warning("Redis cache write for thread %r (version %d) failed: %s", thread_id, version, exc)
            return False

    def put_in_background(self, thread_id: str, version: int, state_json: str) -> None:
        """Off the critical path: the version guard makes out-of-order completion harmless."""
        task = asyncio.get_running_loop().create_task(self.put(thread_id, version, state_json))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def flush(self) -> None:
        """Wait for pending background writes (tests and shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks))

    async def delete(self, thread_id: str) -> None:
        try:
            await (await self._connect()).delete(self.key(thread_id))
        except Exception as exc:
            log.warning("Redis cache delete for thread %r failed: %s", thread_id, exc)

    async def close(self) -> None:
        await self.flush()
        if self._client is not None and self._user_client is None:
            await self._client.aclose()
            self._client, self._script = None, None


class CacheMethods:
    """PgCheckpointer's methods about its cache (its ``schema`` names the keys; ``_cache`` is None without one)."""

    schema: str
    _cache: RedisStateCache | None

    @property
    def cache_prefix(self) -> str:
        """Every Redis key this checkpointer writes starts with this (one prefix per schema)."""
        return f"tenxgraph:{self.schema}:"

    def cache_key(self, thread_id: str) -> str:
        """The Redis hash holding *thread_id*'s cached state (fields ``version`` and ``state``)."""
        return thread_key(self.cache_prefix, thread_id)

    async def acache_put(self, thread_id: str, version: int, state_json: str) -> bool:
        """Write the cache if *version* is newer than the cached one (atomic). False if refused or Redis is down."""
        return await self._cache.put(thread_id, version, state_json) if self._cache is not None else False

    async def aflush_cache_writes(self) -> None:
        """Wait for pending background cache writes (tests and shutdown)."""
        if self._cache is not None:
            await self._cache.flush()
