"""The ledger's store, used from Pydantic AI's event loop: :class:`HomeLoopLedger` runs each of the store's calls on
the loop of tenxgraph's sync wrappers (:func:`tenxgraph.utils.sync.on_sync_loop`). ``agent.run_sync`` runs on a
loop of Pydantic AI's, ``agent.run`` on the caller's; a store whose connections belong to the loop that opened them
(``PgCheckpointer``'s pool) then keeps them on one loop, the one its ``close()`` runs on, whichever loops the runs
use. A transactional tool's transaction runs there too, and the tool's body runs back on the run's loop."""

from __future__ import annotations

import asyncio
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
        #: How the store runs a transactional tool: ``"sync"`` (SQLite: a plain function in its worker thread),
        #: ``"async"`` (PostgreSQL: a coroutine), None (it runs none: ``InMemoryCheckpointer``).
        self.transactions: str | None = getattr(store, "transactions", None)

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
        """The store's transaction, opened on the home loop. SQLite runs *work* (a plain function) in its worker
        thread; PostgreSQL's *work* (a coroutine function) is run back on the caller's loop, while the home loop
        holds the transaction: each statement of the body goes to the connection's loop
        (:class:`~tenxgraph.ledger.LoopTransaction`)."""
        if self.transactions != "async":
            return await on_sync_loop(self.store.atransact(thread_id, key, work))
        caller = asyncio.get_running_loop()

        async def on_caller_loop(connection: Any) -> Any:
            if asyncio.get_running_loop() is caller:  # (the caller's loop is the home loop)
                return await work(connection)
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work(connection), caller))

        return await on_sync_loop(self.store.atransact(thread_id, key, on_caller_loop))

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
