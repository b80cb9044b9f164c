"""In-doubt policies: a call whose intent was recorded but whose result was not may or may not have happened.
``retry`` runs it again (with the same idempotency key), ``fail`` answers with an in-doubt error without running
it, ``reconcile`` asks the tool's ``reconcile`` function whether it happened.

Called by the ledger (:mod:`.invoke_node_handler`); it decides, and the ledger records: nothing here writes a
result or calls back."""

from __future__ import annotations

import inspect
import logging

from tenxgraph.core.graph.utils.instrument import notify
from tenxgraph.core.graph.utils.ledger_record import RECORD_VERSION, Decision, LedgerCall, error_execution, execution_of
from tenxgraph.state.messages import JSON
from tenxgraph.storage.ledger_store import LedgerStore
from tenxgraph.utils.constants import LOGGER_NAME
from tenxgraph.utils.errors import IntentWriteError
from tenxgraph.utils.events import emit_event

log = logging.getLogger(LOGGER_NAME)


RUN_AGAIN = Decision()


async def write_intent(call: LedgerCall, checkpointer: LedgerStore) -> None:
    """Before an opted-in tool runs: a ``started`` record, so a resume can tell the call is in doubt. If it cannot
    be written, the tool does not run (:class:`IntentWriteError` stops the run; the thread stays resumable): run
    without it, and a crash during the call, or a refused record write after it, would go undetected."""
    assert call.intent_key is not None
    thread_id = call.info.thread_id
    try:
        intent: dict[str, JSON] = {"v": RECORD_VERSION, "kind": "intent", "tool": call.name, "call_id": call.block.id}
        await checkpointer.aput_tool_intent(thread_id, call.intent_key, intent)
    except Exception as exc:
        raise IntentWriteError(call.name, call.intent_key, thread_id, exc) from exc


async def resolve_in_doubt(call: LedgerCall, args: dict[str, JSON]) -> Decision:
    """The ledger holds an intent but no result: the call may or may not have happened. Apply the tool's policy."""
    tool, block, key, info = call.tool, call.block, call.key, call.info
    assert tool is not None and key is not None
    notify("in_doubt", info)
    policy = tool.policy or "retry"
    where = f"(key {key!r}, thread {info.thread_id!r})"
    if policy == "retry":
        log.warning("tool %r was in doubt %s: running it again with the same idempotency key", block.name, where)
        return RUN_AGAIN
    if policy == "fail":
        emit_event("tool_in_doubt", tool=block.name, key=key, thread=info.thread_id, policy="fail")
        text = (
            f"tool {block.name!r} is in doubt: a previous attempt started but its outcome is unknown, so it was not "
            "run again; check with the provider before retrying"
        )
        return Decision(error_execution(block, key, text, status="in_doubt"), record=True)
    try:
        assert tool.reconcile is not None
        found = tool.reconcile(info.idempotency_key, args)
        if inspect.isawaitable(found):
            found = await found
    except Exception as exc:
        log.error("reconcile of in-doubt tool %r failed %s: %s: %s", block.name, where, type(exc).__name__, exc)
        emit_event("tool_in_doubt", tool=block.name, key=key, thread=info.thread_id, policy="reconcile", error=str(exc))
        text = f"tool {block.name!r} is in doubt and reconcile failed: {exc}"
        return Decision(error_execution(block, key, text, status="in_doubt"))
    if found is None:
        log.warning("tool %r was in doubt %s; reconcile says it did not happen: running it", block.name, where)
        return RUN_AGAIN
    log.warning("tool %r was in doubt %s; reconcile found its result: using it", block.name, where)
    return Decision(execution_of(block, key, found), record=True)
