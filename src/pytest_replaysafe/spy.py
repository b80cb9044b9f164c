"""The harness's view of the ledger: a checkpointer wrapper that logs every record write, independently of the
runtime's own instrumentation (a broken runtime cannot hide a record it wrote too early or with a wrong value)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

from pytest_replaysafe.evidence import Entry, ExecutionLog, fingerprint
from pytest_replaysafe.matrix import first_state_path
from tenxgraph.core.state.messages import JSON, Message
from tenxgraph.storage.checkpointer.base import BaseCheckpointer, ThreadSnapshot


class RecordingCheckpointer(BaseCheckpointer):
    """Delegates everything to *inner*; logs ledger writes to *log*. ``bypass_lock`` makes :meth:`arun_lock` a
    no-op: the harness uses it to stand for a run that got the lock because another run lost it."""

    def __init__(self, inner: BaseCheckpointer, log: ExecutionLog) -> None:
        self.inner = inner
        self.log = log
        self.bypass_lock = False
        self.durable = inner.durable
        self.backend_name = inner.backend_name

    def __getattr__(self, name: str) -> Any:  # backend-specific helpers (cache_key, setup, ...)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"RecordingCheckpointer({self.inner!r})"

    async def aget_thread(self, thread_id: str) -> ThreadSnapshot | None:
        return await self.inner.aget_thread(thread_id)

    async def aput_thread(
        self, thread_id: str, values: dict[str, JSON], *, expected_version: int, new_messages: Sequence[Message] = ()
    ) -> int:
        version = await self.inner.aput_thread(
            thread_id, values, expected_version=expected_version, new_messages=new_messages
        )
        if expected_version == 0:  # the state a cache could hold stale later (see matrix.Backend.stale_cache)
            first_state_path(self.log.path.parent, thread_id).write_text(json.dumps(values))
        return version

    async def alist_messages(self, thread_id: str) -> list[Message]:
        return await self.inner.alist_messages(thread_id)

    async def aappend_messages(self, thread_id: str, messages: Sequence[Message]) -> None:
        await self.inner.aappend_messages(thread_id, messages)

    async def aget_tool_results(self, thread_id: str, keys: Sequence[str]) -> dict[str, dict[str, JSON]]:
        return await self.inner.aget_tool_results(thread_id, keys)

    async def aput_tool_result(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        tool = record.get("tool")
        fp = fingerprint(record.get("output"))
        self.log.write(Entry(thread_id, key, "record", str(tool) if tool else None, fp, bool(record.get("is_error"))))
        written = await self.inner.aput_tool_result(thread_id, key, record)
        self.log.write(Entry(thread_id, key, "recorded", str(tool) if tool else None, fp))
        return written

    async def aput_tool_intent(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        return await self.inner.aput_tool_intent(thread_id, key, record)

    async def alist_tool_results(self, thread_id: str) -> dict[str, dict[str, JSON]]:
        return await self.inner.alist_tool_results(thread_id)

    async def aprune_tool_executions(
        self, older_than: timedelta, *, include_resumable: bool = False, batch_size: int = 1000
    ) -> int:
        return await self.inner.aprune_tool_executions(
            older_than, include_resumable=include_resumable, batch_size=batch_size
        )

    async def adelete_thread(self, thread_id: str) -> None:
        await self.inner.adelete_thread(thread_id)

    @contextlib.asynccontextmanager
    async def arun_lock(self, thread_id: str) -> AsyncIterator[None]:
        if self.bypass_lock:
            yield
            return
        async with self.inner.arun_lock(thread_id):
            yield

    async def acheck_run_lock(self, thread_id: str) -> None:
        if not self.bypass_lock:
            await self.inner.acheck_run_lock(thread_id)

    async def aclose(self) -> None:
        await self.inner.aclose()
