"""OpenAI Agents SDK agents made replay-safe on the ledger (the ``openai_agents`` extra:
``pip install ".[openai-agents]"``), through the SDK's public interfaces: its ``Model`` and its function tools'
``on_invoke_tool``.

- :func:`replay_safe`: a copy of an ``agents.Agent`` for one run (its ``run_id``) whose model's responses are
  journaled in the ledger's store (a resumed run does not ask the model again for a turn it has: the same
  function calls, the same ``call_id``\\s) and whose function tools run through the ledger, each call keyed by
  the journaled response item that asked for it and its ``call_id``: a recorded call is replayed, never run
  again; parallel calls are recorded one by one as they return, with effect classes, in-doubt policies and
  idempotency keys. Resume a run after a crash by running it again, with the same input and ``run_id``, from
  any process.
- :func:`run_replay_safe`: ``Runner.run`` of such a copy under its run's lock: k processes that resume one run at
  once (or answer one pause from a ``RunState``) take it in turn, each later one replaying what the first did.
  :func:`stream_replay_safe`: the same for ``Runner.run_streamed`` (the model's streamed turns journaled too).
  Both record a ``RunState``'s answers once (:mod:`.decisions`) and rewind a run's session to where the run
  began (:mod:`.sessions`).
- :func:`declare`: a function tool's effect class, in-doubt policy and reconcile function, declared on the tool
  (``replay_safe`` applies it to every run; a test harness reads it before the first).
- MCP servers (``Agent(mcp_servers=[...])``): their tools run through the ledger too, each one's effect class
  from its MCP annotations (:mod:`.mcp`); :func:`idempotency_meta`, given to a server as its
  ``tool_meta_resolver``, sends each call's idempotency key in the request's ``_meta``.
- :func:`current_idempotency_key`: the key of the tool call running now, for the payment or email provider.
- :func:`to_messages`: a run's conversation (its input and ``result.raw_responses`` / ``result.new_items``) as
  tenxgraph messages, each call under the ledger's id for it.

See docs/openai-agents.md. Importing this package needs no SDK; its names import it on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tenxgraph.utils.constants import install_hint
from tenxgraph.utils.lazy import lazy_names

if TYPE_CHECKING:
    from tenxgraph.integrations.openai_agents.journal import JournaledModel
    from tenxgraph.integrations.openai_agents.mcp import idempotency_meta
    from tenxgraph.integrations.openai_agents.messages import to_messages
    from tenxgraph.integrations.openai_agents.runs import run_replay_safe, stream_replay_safe
    from tenxgraph.integrations.openai_agents.tools import current_idempotency_key, declare, replay_safe

__all__ = [
    "JournaledModel",
    "current_idempotency_key",
    "declare",
    "idempotency_meta",
    "replay_safe",
    "run_replay_safe",
    "stream_replay_safe",
    "to_messages",
]
_WHERE = {
    "JournaledModel": "tenxgraph.integrations.openai_agents.journal",
    "to_messages": "tenxgraph.integrations.openai_agents.messages",
    "idempotency_meta": "tenxgraph.integrations.openai_agents.mcp",
    "current_idempotency_key": "tenxgraph.integrations.openai_agents.tools",
    "declare": "tenxgraph.integrations.openai_agents.tools",
    "replay_safe": "tenxgraph.integrations.openai_agents.tools",
    "run_replay_safe": "tenxgraph.integrations.openai_agents.runs",
    "stream_replay_safe": "tenxgraph.integrations.openai_agents.runs",
}


def require_openai_agents() -> None:
    """Raise an ImportError that names the extra if the OpenAI Agents SDK is missing."""
    try:
        import agents  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"tenxgraph.integrations.openai_agents needs openai-agents>=0.24 ({exc.name} is "
                          f"missing): {install_hint('openai-agents')}") from exc  # fmt: skip


__getattr__ = lazy_names(__name__, _WHERE, require_openai_agents)
