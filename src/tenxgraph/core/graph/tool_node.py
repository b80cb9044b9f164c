"""ToolNode: the graph node that runs (or replays) the tool calls of the last assistant message."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from tenxgraph.core.tools.context import current_run
from tenxgraph.ledger import Tool, invoke_tool_calls
from tenxgraph.state.messages import JSON
from tenxgraph.state.state import AgentState
from tenxgraph.utils.errors import GraphBuildError


class ToolNode:
    """Plain functions (sync or async) or :class:`Tool` objects become the tools of this node."""

    def __init__(self, tools: Iterable[Callable[..., Any] | Tool]) -> None:
        self.tools: dict[str, Tool] = {}
        for fn in tools:
            tool = fn if isinstance(fn, Tool) else Tool.from_function(fn)
            if tool.name in self.tools:
                raise GraphBuildError(f"two tools are named {tool.name!r}; tool names must be unique")
            self.tools[tool.name] = tool

    def with_in_doubt_default(self, policy: str | None) -> ToolNode:
        """A node whose tools that say nothing of ``on_in_doubt`` get *policy* (the graph-wide default)."""
        return ToolNode([tool.with_default_policy(policy) for tool in self.tools.values()])

    def schemas(self) -> list[dict[str, JSON]]:
        return [tool.schema() for tool in self.tools.values()]

    async def __call__(self, state: AgentState) -> dict[str, Any]:
        ctx = current_run()
        if ctx is None:
            raise RuntimeError("ToolNode runs inside a compiled graph; call graph.invoke(...) instead")
        message = state.last_message
        if message is None or message.role != "assistant" or not message.tool_calls:
            return {}
        executions = await invoke_tool_calls(
            message,
            self.tools,
            ctx.checkpointer,
            ctx.thread_id,
            tool_timeout=ctx.config.tool_timeout,
            resumed=ctx.resumed,
            pauses=ctx.pauses,
            observer=ctx.observer,
        )
        update: dict[str, Any] = {}
        for execution in executions:  # in call order: a later call's field update wins
            update.update(execution.update or {})
        update["messages"] = [execution.message() for execution in executions]
        return update
