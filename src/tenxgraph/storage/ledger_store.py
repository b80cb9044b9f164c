"""The storage contract of the ledger, on its own: the six methods the ledger calls (read records, write a result,
a group of results or an intent, run a transactional tool in the record's transaction, check the run lock).

Every checkpointer of this package implements it (``BaseCheckpointer`` declares them all); a store of your own
that only holds the ledger implements these and nothing else, and is certified by the conformance suite's ledger
role (``pytest_replaysafe.conformance``). An integration types its ledger argument with it
(``tenxgraph.ledger.LedgerStore``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from tenxgraph.state.messages import JSON
from tenxgraph.utils.errors import SerializationError

__all__ = ["LEDGER_METHODS", "LedgerStore"]


@runtime_checkable
class LedgerStore(Protocol):
    """Where the ledger keeps a thread's tool-call records (see :class:`~tenxgraph.storage.checkpointer.base.
    BaseCheckpointer` for each method's full contract)."""

    async def aget_tool_results(self, thread_id: str, keys: Sequence[str]) -> dict[str, dict[str, JSON]]:
        """Records for those of *keys* that have one (a result, or an intent), in one round trip."""
        ...

    async def aput_tool_result(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        """Store *record* under *key* unless a result is stored already (first write wins; an intent is
        replaced). True if this call wrote it."""
        ...

    async def aput_tool_results(
        self, thread_id: str, records: Sequence[tuple[str, dict[str, JSON]]]
    ) -> list[bool | SerializationError]:
        """Several records (distinct keys) as one durable write where the storage can: the group commit."""
        ...

    async def aput_tool_intent(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        """Store an intent under *key* unless anything is stored there. True if written."""
        ...

    async def atransact(self, thread_id: str, key: str, work: Callable[[Any], Any]) -> tuple[dict[str, JSON], bool]:
        """Run ``work(connection)`` and store its record under *key* in one transaction (a store without one
        raises ``NotImplementedError``: its tools cannot say ``effect="transactional"``)."""
        ...

    async def acheck_run_lock(self, thread_id: str) -> None:
        """Raise ``RunLockLostError`` if this process no longer holds *thread_id*'s run lock (fencing)."""
        ...


#: The names of the contract's methods (what the conformance suite's ledger role calls).
LEDGER_METHODS = (
    "aget_tool_results",
    "aput_tool_result",
    "aput_tool_results",
    "aput_tool_intent",
    "atransact",
    "acheck_run_lock",
)
