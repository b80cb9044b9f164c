"""An agent's MCP servers (``Agent(mcp_servers=[...])``), their tools through the ledger.

The SDK lists an MCP server's tools at every turn and makes each a ``FunctionTool``; the copy ``replay_safe``
makes of an agent with MCP servers is a :class:`LedgerMcpAgent`, which runs those tools as it runs the agent's
function tools: each call through the ledger, keyed by the journaled item that asked for it and its ``call_id``.
A tool's effect class comes from its MCP annotations as the server lists them, kept by the SDK on the tool it
makes (``readOnlyHint``: ``read``; ``idempotentHint``: ``idempotent``; any other write, or no annotations:
``external``), unless the run declares it by name (``replay_safe(..., effects=...)``).

The call's idempotency key reaches the server in the request's ``_meta`` when the server is given
``tool_meta_resolver=idempotency_meta`` (the SDK calls it inside the call, where the key is current)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agents import Agent, FunctionTool
from agents.run_context import RunContextWrapper
from agents.tool import Tool as SdkTool

from tenxgraph.ledger import current_idempotency_key

__all__ = ["KEY_META", "LedgerMcpAgent", "idempotency_meta"]

#: Where the call's idempotency key travels in a ``tools/call`` request's ``_meta`` (as tenxgraph's MCP
#: integration sends it).
KEY_META = "tenxgraph/idempotency-key"


def idempotency_meta(context: Any) -> dict[str, str] | None:
    """An MCP server's ``tool_meta_resolver``: the running call's idempotency key as ``_meta``
    (``{"tenxgraph/idempotency-key": key}``), the same in every process that resumes the run; None outside a
    replay-safe call."""
    key = current_idempotency_key()
    return {KEY_META: key} if key else None


@dataclass
class LedgerMcpAgent(Agent[Any]):
    """``replay_safe``'s copy of an agent with MCP servers: the tools its servers list run through the ledger."""

    #: The run's calls through the ledger (``replay_safe`` sets them).
    ledger_calls: Any = field(default=None, repr=False, compare=False)

    async def get_mcp_tools(self, run_context: RunContextWrapper[Any]) -> list[SdkTool]:
        tools = await super().get_mcp_tools(run_context)
        calls = self.ledger_calls
        if calls is None:
            return tools
        functions = [tool for tool in tools if isinstance(tool, FunctionTool)]
        calls.learn_mcp(functions)
        return [calls.wrap(tool) if isinstance(tool, FunctionTool) else tool for tool in tools]
