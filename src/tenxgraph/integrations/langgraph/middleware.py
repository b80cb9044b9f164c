"""The ledger as agent middleware for ``langchain``'s ``create_agent`` (``pip install langchain``):
``create_agent(model, tools, middleware=[ReplaySafeMiddleware(ledger=...)], checkpointer=saver)``. The same
protection as :class:`~tenxgraph.integrations.langgraph.tools.ReplaySafeToolNode`, through the agent's own
``ToolNode``; put it first in ``middleware`` so that it is outermost (a retrying middleware inside it is then one
recorded call)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from tenxgraph.core.tools.tool import Reconcile
from tenxgraph.integrations.langgraph.tools import ReplaySafeToolCalls
from tenxgraph.storage.checkpointer.base import BaseCheckpointer
from tenxgraph.utils.constants import TOOL_TIMEOUT

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

    def __init__(
        self,
        ledger: BaseCheckpointer,
        *,
        tool_timeout: float | None = TOOL_TIMEOUT,
        effects: Mapping[str, str] | None = None,
        on_in_doubt: Mapping[str, str] | None = None,
        reconcile: Mapping[str, Reconcile] | None = None,
    ) -> None:
        super().__init__()
        self.calls = ReplaySafeToolCalls(
            ledger, tool_timeout=tool_timeout, effects=effects, on_in_doubt=on_in_doubt, reconcile=reconcile
        )

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return self.calls.wrap_tool_call(request, handler)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        return await self.calls.awrap_tool_call(request, handler)
