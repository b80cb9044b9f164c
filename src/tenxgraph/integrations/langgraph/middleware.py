"""The ledger as agent middleware for ``langchain``'s ``create_agent`` (``pip install langchain``):
``create_agent(model, tools, middleware=[ReplaySafeMiddleware(ledger=...)], checkpointer=saver)``. The same
protection as :class:`~tenxgraph.integrations.langgraph.node.ReplaySafeToolNode`, through the agent's own
``ToolNode``; put it first in ``middleware`` so that it is outermost (a retrying middleware inside it is then one
recorded call)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Unpack

from tenxgraph.integrations.langgraph.tools import ReplaySafeToolCalls, ToolCallsOptions
from tenxgraph.ledger import LedgerStore

try:
    from langchain.agents.middleware import AgentMiddleware
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        f"ReplaySafeMiddleware is middleware for langchain's create_agent ({exc.name} is missing): pip install "
        "langchain; or wrap LangGraph's ToolNode with ReplaySafeToolNode, which needs LangGraph only"
    ) from exc

__all__ = ["ReplaySafeMiddleware"]


class ReplaySafeMiddleware(AgentMiddleware):
    """``create_agent`` middleware whose ``wrap_tool_call`` / ``awrap_tool_call`` run each call through the ledger
    (see :class:`ReplaySafeToolCalls` for the arguments)."""

    def __init__(self, ledger: LedgerStore, **options: Unpack[ToolCallsOptions]) -> None:
        super().__init__()
        self.calls = ReplaySafeToolCalls(ledger, **options)

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return self.calls.wrap_tool_call(request, handler)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        return await self.calls.awrap_tool_call(request, handler)
