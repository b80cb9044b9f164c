"""A checkpointer that forwards every call to another one: the base for wrappers that observe or adjust a
backend (test spies, the crash-matrix harness's ledger recorder) without re-implementing it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from tenxgraph.state.messages import JSON, Message
from tenxgraph.storage.checkpointer.base import BaseCheckpointer, MessagesAfter, ThreadSnapshot
from tenxgraph.utils.errors import SerializationError


class DelegatingCheckpointer(BaseCheckpointer):
    """Forwards everything to *inner*, run lock and fencing included; override what you want to observe.
    Attributes it does not define (``cache_key``, ``setup`` ...) are the inner checkpointer's."""

    def __init__(self, inner: BaseCheckpointer) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copying, unpickling): never recurse
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"

    @property
    def transactions(self) -> str | None:  # type: ignore[override]  # read-only: the inner checkpointer's
        return self.inner.transactions

    async def atransact(self, thread_id: str, key: str, work: Callable[[Any], Any]) -> tuple[dict[str, JSON], bool]:
        return await self.inner.atransact(thread_id, key, work)

    async def alist_interrupted_threads(self, limit: int = 100) -> list[str]:
        return await self.inner.alist_interrupted_threads(limit)

    async def acount_threads(self, status: str) -> int:
        return await self.inner.acount_threads(status)

    async def aget_thread(self, thread_id: str) -> ThreadSnapshot | None:
        return await self.inner.aget_thread(thread_id)

    async def aput_thread(
        self, thread_id: str, values: dict[str, JSON], *, expected_version: int, new_messages: Sequence[Message] = ()
    ) -> int:
        return await self.inner.aput_thread(
            thread_id, values, expected_version=expected_version, new_messages=new_messages
        )

    async def alist_messages(self, thread_id: str) -> list[Message]:
        return await self.inner.alist_messages(thread_id)

    async def alist_messages_after(self, thread_id: str, after_seq: int) -> MessagesAfter | None:
        return await self.inner.alist_messages_after(thread_id, after_seq)

    async def aappend_messages(self, thread_id: str, messages: Sequence[Message]) -> None:
        await self.inner.aappend_messages(thread_id, messages)

    async def aget_tool_results(self, thread_id: str, keys: Sequence[str]) -> dict[str, dict[str, JSON]]:
        return await self.inner.aget_tool_results(thread_id, keys)

    async def aput_tool_result(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        return await self.inner.aput_tool_result(thread_id, key, record)

    async def aput_tool_results(
        self, thread_id: str, records: Sequence[tuple[str, dict[str, JSON]]]
    ) -> list[bool | SerializationError]:
        if type(self).aput_tool_result is not DelegatingCheckpointer.aput_tool_result:
            # a wrapper that intercepts single writes sees every record (one by one) unless it handles groups too
            return await BaseCheckpointer.aput_tool_results(self, thread_id, records)
        return await self.inner.aput_tool_results(thread_id, records)

    async def aput_tool_intent(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        return await self.inner.aput_tool_intent(thread_id, key, record)

    async def alist_tool_results(self, thread_id: str) -> dict[str, dict[str, JSON]]:
        return await self.inner.alist_tool_results(thread_id)

    async def aprune_tool_executions(
        self,
        older_than: timedelta,
        *,
        include_resumable: bool = False,
        finished: Sequence[str] = (),
        batch_size: int = 1000,
    ) -> int:
        return await self.inner.aprune_tool_executions(
            older_than, include_resumable=include_resumable, finished=finished, batch_size=batch_size
        )

    async def adelete_thread(self, thread_id: str) -> None:
        await self.inner.adelete_thread(thread_id)

    @asynccontextmanager
    async def arun_lock(self, thread_id: str) -> AsyncIterator[None]:
        async with self.inner.arun_lock(thread_id):
            yield

    def read_with_lock(self, thread_id: str, messages_after: int) -> None:
        self.inner.read_with_lock(thread_id, messages_after)

    def write_with_lock(self, thread_id: str, values: dict[str, JSON], *, new_messages: Sequence[Message]) -> None:
        self.inner.write_with_lock(thread_id, values, new_messages=new_messages)

    def read_ledger_with_lock(self, thread_id: str, keys: Sequence[str]) -> None:
        self.inner.read_ledger_with_lock(thread_id, keys)

    def release_lock_with_next_write(self, thread_id: str) -> None:
        self.inner.release_lock_with_next_write(thread_id)

    async def acheck_run_lock(self, thread_id: str) -> None:
        await self.inner.acheck_run_lock(thread_id)

    async def aclose(self) -> None:
        await self.inner.aclose()
