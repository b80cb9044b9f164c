"""The ledger's store, used from Pydantic AI's event loop: :class:`HomeLoopLedger` runs each of the store's calls on
the loop of tenxgraph's sync wrappers (:func:`tenxgraph.utils.sync.on_sync_loop`). ``agent.run_sync`` runs on a
loop of Pydantic AI's, ``agent.run`` on the caller's; a store whose connections belong to the loop that opened them
(``PgCheckpointer``'s pool) then keeps them on one loop, the one its ``close()`` runs on, whichever loops the runs
use."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from tenxgraph.ledger import LedgerStore
from tenxgraph.state.messages import JSON
from tenxgraph.utils.errors import SerializationError
from tenxgraph.utils.sync import on_sync_loop

__all__ = ["HomeLoopLedger"]


class HomeLoopLedger:
    """*store*'s ledger methods, each run on the sync wrappers' loop (a :class:`~tenxgraph.ledger.LedgerStore`)."""

    def __init__(self, store: LedgerStore) -> None:
        self.store = store
        #: How the store runs a transactional tool (None: this adapter runs none).
        self.transactions: str | None = None

    async def aget_tool_results(self, thread_id: str, keys: Sequence[str]) -> dict[str, dict[str, JSON]]:
        return await on_sync_loop(self.store.aget_tool_results(thread_id, keys))

    async def aput_tool_result(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        return await on_sync_loop(self.store.aput_tool_result(thread_id, key, record))

    async def aput_tool_results(
        self, thread_id: str, records: Sequence[tuple[str, dict[str, JSON]]]
    ) -> list[bool | SerializationError]:
        return await on_sync_loop(self.store.aput_tool_results(thread_id, records))

    async def aput_tool_intent(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        return await on_sync_loop(self.store.aput_tool_intent(thread_id, key, record))

    async def atransact(self, thread_id: str, key: str, work: Callable[[Any], Any]) -> tuple[dict[str, JSON], bool]:
        raise NotImplementedError("transactional tools are not supported on Pydantic AI agents yet")

    async def acheck_run_lock(self, thread_id: str) -> None:
        await on_sync_loop(self.store.acheck_run_lock(thread_id))

    @asynccontextmanager
    async def arun_lock(self, thread_id: str) -> AsyncIterator[None]:
        """The store's run lock, taken and let go on the home loop (a PostgreSQL lock holds a connection of the
        pool there; its lease is renewed there)."""
        take: Callable[[str], Any] | None = getattr(self.store, "arun_lock", None)
        if take is None:
            raise NotImplementedError(f"the {type(self.store).__name__} ledger has no run lock")
        stack = AsyncExitStack()
        await on_sync_loop(stack.enter_async_context(take(thread_id)))
        try:
            yield
        finally:
            await on_sync_loop(stack.aclose())
