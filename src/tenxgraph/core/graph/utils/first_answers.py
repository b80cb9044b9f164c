"""A person's answers to a run's pauses, recorded once: :func:`record_first_answers`. Every integration that
resumes a paused run (LangGraph's interrupts, Pydantic AI's deferred tool results, the OpenAI Agents SDK's
``RunState`` approvals) records each answer in the run's thread before the run goes on; the first answer recorded
for a pause stands (the ledger's first write wins), the same answer again goes on, and another one is refused."""

from __future__ import annotations

from collections.abc import Mapping

from tenxgraph.state.messages import JSON
from tenxgraph.storage.ledger_store import LedgerStore
from tenxgraph.utils.errors import ConfigError, InterruptDecidedError, SerializationError

__all__ = ["record_first_answers"]


async def record_first_answers(
    ledger: LedgerStore,
    thread: str,
    records: Mapping[str, tuple[str, dict[str, JSON]]],
    found: dict[str, dict[str, JSON]] | None = None,
) -> dict[str, dict[str, JSON]]:
    """Record the answers *records* gives (per pause: its ledger key and the record, whose ``value`` is the
    answer) that *thread* has no record of yet, in one write, and raise :class:`InterruptDecidedError` (naming
    the pause) when one differs from the answer recorded for it before: that one stands. *found*: the thread's
    records of those keys when the caller read them already (under its lock), else read here. Returns the
    records that stand, by key (the ones written here included only when another writer's won)."""
    keys = [key for key, _ in records.values()]
    if found is None:
        found = await ledger.aget_tool_results(thread, keys)
    new = [(key, record) for key, record in records.values() if key not in found]
    if new:
        written = await ledger.aput_tool_results(thread, new)
        lost: list[str] = []
        for (key, _), outcome in zip(new, written, strict=True):
            if isinstance(outcome, SerializationError):
                raise ConfigError(
                    f"the answer recorded under {key!r} cannot be stored ({outcome}): answer with JSON values"
                ) from outcome
            if outcome is not True:
                lost.append(key)
        if lost:  # (another resumer's, recorded just now: outside this one's lock, or a store without locks)
            found.update(await ledger.aget_tool_results(thread, lost))
    for pause, (key, record) in records.items():
        standing = found.get(key)
        if standing is not None and standing.get("value") != record["value"]:
            raise InterruptDecidedError(thread, pause, standing.get("value"), record["value"])
    return found
