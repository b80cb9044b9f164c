"""Replay-safe tool calls for LangGraph agents (the ``langgraph`` extra: ``pip install 'tenxgraph[langgraph]'``).

- :class:`ReplaySafeToolNode`: a drop-in for LangGraph's ``ToolNode(tools)`` whose calls go through our ledger:
  ``ReplaySafeToolNode(tools, ledger=SqliteCheckpointer("agent.db"))``.
- :class:`ReplaySafeToolCalls`: the same protection as ``wrap_tool_call`` / ``awrap_tool_call`` functions, for a
  ``ToolNode`` you build yourself: ``ToolNode(tools, wrap_tool_call=calls.wrap_tool_call,
  awrap_tool_call=calls.awrap_tool_call)``.
- :class:`ReplaySafeMiddleware`: the same as middleware for ``langchain``'s ``create_agent`` (needs ``langchain``).
- :func:`current_idempotency_key`: in a tool's body, the call's idempotency key (pass it to your provider).
- :func:`to_messages`: a LangGraph conversation as tenxgraph :class:`~tenxgraph.Message` objects.
- :func:`resume` / :func:`aresume`: resume a thread after a crash, whenever it came (``invoke(None)``, or the
  input again if no checkpoint was saved yet).
- :func:`current_transaction`: in a transactional tool's body (``effect="transactional"``), the ledger's
  transaction its writes commit in, with the call's record.
- :class:`CrashPointSaver`: wraps a LangGraph saver so that the ``langgraph.*`` crash points fire in a test.
- :func:`prune_ledger` / :func:`aprune_ledger`: the ledger's retention job, which prunes the records of the
  threads LangGraph's saver shows finished (a paused thread keeps its records however long it waits).

See docs/langgraph.md. Importing this package needs no LangGraph; its names import it on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tenxgraph.utils.lazy import lazy_names

if TYPE_CHECKING:
    from tenxgraph.integrations.langgraph.messages import to_messages
    from tenxgraph.integrations.langgraph.middleware import ReplaySafeMiddleware
    from tenxgraph.integrations.langgraph.node import ReplaySafeToolNode
    from tenxgraph.integrations.langgraph.resuming import aresume, resume
    from tenxgraph.integrations.langgraph.retention import aprune_ledger, prune_ledger
    from tenxgraph.integrations.langgraph.saver import CrashPointSaver
    from tenxgraph.integrations.langgraph.tools import ReplaySafeToolCalls, current_idempotency_key
    from tenxgraph.integrations.langgraph.transaction import current_transaction

__all__ = [
    "CrashPointSaver",
    "ReplaySafeMiddleware",
    "ReplaySafeToolCalls",
    "ReplaySafeToolNode",
    "aprune_ledger",
    "aresume",
    "aresume_once",
    "current_idempotency_key",
    "current_transaction",
    "prune_ledger",
    "resume",
    "resume_once",
    "to_messages",
]

_WHERE = {
    "CrashPointSaver": "tenxgraph.integrations.langgraph.saver",
    "ReplaySafeMiddleware": "tenxgraph.integrations.langgraph.middleware",
    "ReplaySafeToolCalls": "tenxgraph.integrations.langgraph.tools",
    "ReplaySafeToolNode": "tenxgraph.integrations.langgraph.node",
    "to_messages": "tenxgraph.integrations.langgraph.messages",
    "current_idempotency_key": "tenxgraph.integrations.langgraph.tools",
    "current_transaction": "tenxgraph.integrations.langgraph.transaction",
    "resume": "tenxgraph.integrations.langgraph.resuming",
    "aresume": "tenxgraph.integrations.langgraph.resuming",
    "resume_once": "tenxgraph.integrations.langgraph.answering",
    "aresume_once": "tenxgraph.integrations.langgraph.answering",
    "prune_ledger": "tenxgraph.integrations.langgraph.retention",
    "aprune_ledger": "tenxgraph.integrations.langgraph.retention",
}
EXTRA_HINT = "install the extra: pip install 'tenxgraph[langgraph]' (LangGraph >= 1.0 and langchain-core)"


def require_langgraph() -> None:
    """Raise an ImportError that names the extra if LangGraph or langchain-core is missing."""
    try:
        import langchain_core.messages  # noqa: F401
        import langgraph.prebuilt  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"tenxgraph.integrations.langgraph needs LangGraph ({exc.name} is missing): {EXTRA_HINT}"
        ) from exc


__getattr__ = lazy_names(__name__, _WHERE, require_langgraph)
