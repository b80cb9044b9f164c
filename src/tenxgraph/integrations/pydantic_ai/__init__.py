"""Pydantic AI agents made durable on the ledger (the ``pydantic_ai`` extra: ``pip install ".[pydantic-ai]"``,
``pydantic-ai-slim``), through Pydantic AI's own API for durable execution engines (``pydantic_ai.durable_exec``).

- :class:`LedgerDurability`: a capability for ``Agent(..., capabilities=[LedgerDurability(ledger)])``. Every run
  with a ``run_id`` is durable: the model's responses are journaled (a resumed run does not ask the model again
  for a turn it has), and every tool call goes through the ledger, keyed by the journaled response and the call's
  ``tool_call_id``: recorded calls replay, parallel calls are recorded one by one as they return, with effect
  classes, in-doubt policies and idempotency keys. Resume a run after a crash by running it again with the same
  ``run_id``, from any process.
- :func:`resume_once` / :func:`aresume_once`: a person's answers to deferred tools (approvals) recorded first,
  then the run: one decision per call, whoever sends it, and the approved call run once.
- :func:`current_idempotency_key`: the key of the tool call running now, for the payment or email provider;
  :func:`send_idempotency_key`: an MCP toolset's ``process_tool_call`` that sends it in the request's ``_meta``.
- :func:`current_transaction`: in a transactional tool's body (``effect="transactional"``, on SQLite or
  PostgreSQL), the transaction its writes go through, committed with the call's record.
- :func:`to_messages`: a run's messages (``result.all_messages()``) as tenxgraph messages, each response with the
  ledger's id for it.

See docs/pydantic-ai.md. Importing this package needs no Pydantic AI; its names import it on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tenxgraph.utils.constants import install_hint
from tenxgraph.utils.lazy import lazy_names

if TYPE_CHECKING:
    from tenxgraph.integrations.pydantic_ai.answering import aresume_once, resume_once
    from tenxgraph.integrations.pydantic_ai.durability import (
        LedgerDurability,
        current_idempotency_key,
        current_transaction,
    )
    from tenxgraph.integrations.pydantic_ai.mcp_calls import KEY_META, send_idempotency_key
    from tenxgraph.integrations.pydantic_ai.messages import to_messages

__all__ = [
    "KEY_META",
    "LedgerDurability",
    "aresume_once",
    "current_idempotency_key",
    "current_transaction",
    "resume_once",
    "send_idempotency_key",
    "to_messages",
]
_WHERE = {name: "tenxgraph.integrations.pydantic_ai.durability" for name in __all__} | {
    "aresume_once": "tenxgraph.integrations.pydantic_ai.answering",
    "resume_once": "tenxgraph.integrations.pydantic_ai.answering",
    "KEY_META": "tenxgraph.integrations.pydantic_ai.mcp_calls",
    "send_idempotency_key": "tenxgraph.integrations.pydantic_ai.mcp_calls",
    "to_messages": "tenxgraph.integrations.pydantic_ai.messages",
}


def require_pydantic_ai() -> None:
    """Raise an ImportError that names the extra if Pydantic AI (with its durability API) is missing."""
    try:
        import pydantic_ai.durable_exec  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"tenxgraph.integrations.pydantic_ai needs pydantic-ai-slim>=2.78 ({exc.name} is "
                          f"missing): {install_hint('pydantic-ai')}") from exc  # fmt: skip


__getattr__ = lazy_names(__name__, _WHERE, require_pydantic_ai)
