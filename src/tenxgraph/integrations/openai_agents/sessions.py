"""A run on an SDK session (``Runner.run(agent, input, session=...)``), resumable: the session rewound to where
the run began before the run goes on.

The SDK saves a run's input in its session when the run starts, then each turn's items; a crash leaves the
session with part of the run in it, and a run started again on the session is asked about a conversation that
is not the one the crashed run had (its input twice, half a turn): the model is asked anew and its new calls run
again. :func:`~.runs.run_replay_safe` hands the SDK a :class:`RewoundSession` around the caller's session: on
the run's first use of it (under the run's lock), the number of items the session held when the run first began
is recorded in the run's thread (``session-start:{run_id}``, first write wins), and the items found beyond it,
the crashed run's, are popped (the session's own ``pop_item``). The run then begins on the conversation it began
on the first time: its journaled turns are replayed, its recorded calls answered from their records, and the
session gets each of the run's items once. A finished run resumed again ends with the same session.

One run at a time on one session (runs of other run ids appending to it meanwhile would lose their items to the
rewind)."""

from __future__ import annotations

from typing import Any

from tenxgraph.ledger import LedgerStore
from tenxgraph.state.messages import JSON
from tenxgraph.utils.errors import ConfigError

__all__ = ["RewoundSession", "session_key"]


def session_key(run_id: str) -> str:
    """Where a run records how many items its session held when it first began."""
    return f"session-start:{run_id}"


class RewoundSession:
    """*inner* (an ``agents.memory.Session``), rewound to where run *run_id* began on its first use in a run."""

    def __init__(self, inner: Any, ledger: LedgerStore, thread: str, run_id: str) -> None:
        self.inner, self.ledger, self.thread, self.run_id = inner, ledger, thread, run_id
        self.session_id = inner.session_id
        self.session_settings = getattr(inner, "session_settings", None)
        self.rewound = False

    async def get_items(self, limit: int | None = None) -> list[Any]:
        await self.rewind()
        items: list[Any] = await self.inner.get_items(limit)
        return items

    async def add_items(self, items: list[Any]) -> None:
        await self.rewind()
        await self.inner.add_items(items)

    async def pop_item(self) -> Any:
        await self.rewind()
        return await self.inner.pop_item()

    async def clear_session(self) -> None:
        await self.inner.clear_session()

    async def rewind(self) -> None:
        """Once: record where the run began (its first time), and pop what a crashed run of it left beyond."""
        if self.rewound:
            return
        held = len(await self.inner.get_items())
        key = session_key(self.run_id)
        record: dict[str, JSON] = {"v": 1, "kind": "session_start", "session": self.session_id, "items": held}
        if not await self.ledger.aput_tool_result(self.thread, key, record):
            record = (await self.ledger.aget_tool_results(self.thread, [key]))[key]
        began = record["items"]
        if not isinstance(began, int) or record.get("session") != self.session_id or held < began:
            raise ConfigError(
                f"OpenAI Agents SDK run {self.run_id!r} began on session {record.get('session')!r} with {began} "
                f"items; session {self.session_id!r} holds {held}: it is another session, or it was cleared or "
                "edited since. Resume the run on the session it began on, or start a new run with another run_id"
            )
        for _ in range(held - began):
            await self.inner.pop_item()
        self.rewound = True
