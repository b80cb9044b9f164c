"""LangGraph's ``ToolNode`` with the ledger around each call (:class:`ReplaySafeToolNode`): a drop-in that builds
its :class:`~tenxgraph.integrations.langgraph.tools.ReplaySafeToolCalls` and passes every other argument on."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from langchain_core.tools import BaseTool
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest

from tenxgraph.core.tools.interrupts import ApprovalRule
from tenxgraph.integrations.langgraph.tools import AsyncExecute, Execute, ReplaySafeToolCalls, Result
from tenxgraph.ledger import LedgerStore, Reconcile
from tenxgraph.utils.constants import TOOL_TIMEOUT
from tenxgraph.utils.errors import ConfigError

__all__ = ["ReplaySafeToolNode"]


class ReplaySafeToolNode(ToolNode):
    """LangGraph's ``ToolNode`` whose calls go through our ledger: ``ReplaySafeToolNode(tools, ledger=...)``, a
    drop-in for ``ToolNode(tools)`` (every other ``ToolNode`` argument is passed on; a ``wrap_tool_call`` of your
    own runs inside the ledger's, so its retries are one recorded call). See :class:`ReplaySafeToolCalls`."""

    def __init__(
        self,
        tools: Sequence[BaseTool | Callable[..., Any]],
        *,
        ledger: LedgerStore,
        effects: Mapping[str, str] | None = None,
        on_in_doubt: Mapping[str, str] | None = None,
        reconcile: Mapping[str, Reconcile] | None = None,
        approvals: Mapping[str, ApprovalRule] | None = None,
        tool_timeout: float | None = TOOL_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        calls = ReplaySafeToolCalls(
            ledger, tool_timeout=tool_timeout, effects=effects, on_in_doubt=on_in_doubt, reconcile=reconcile,
            approvals=approvals, messages_key=kwargs.get("messages_key", "messages"),
        )  # fmt: skip
        inner, ainner = kwargs.pop("wrap_tool_call", None), kwargs.pop("awrap_tool_call", None)
        super().__init__(
            tools, wrap_tool_call=_outer(calls, inner), awrap_tool_call=_aouter(calls, ainner, inner), **kwargs
        )
        calls.check(list(self.tools_by_name.values()))
        unknown = sorted(set(calls.effects) | set(calls.on_in_doubt) | set(calls.reconcile) | set(calls.approvals))
        unknown = [name for name in unknown if name not in self.tools_by_name]
        if unknown:
            raise ConfigError(
                f"ReplaySafeToolNode: no tool named {', '.join(map(repr, unknown))}; its tools: "
                f"{', '.join(self.tools_by_name)}"
            )
        self.replay_safe = calls


def _outer(
    calls: ReplaySafeToolCalls, inner: Callable[[ToolCallRequest, Execute], Result] | None
) -> Callable[[ToolCallRequest, Execute], Result]:
    if inner is None:
        return calls.wrap_tool_call
    return lambda request, execute: calls.wrap_tool_call(request, lambda req: inner(req, execute))


def _aouter(
    calls: ReplaySafeToolCalls,
    ainner: Callable[[ToolCallRequest, AsyncExecute], Awaitable[Result]] | None,
    inner: Callable[[ToolCallRequest, Execute], Result] | None,
) -> Callable[[ToolCallRequest, AsyncExecute], Awaitable[Result]]:
    if ainner is None and inner is not None:
        raise ConfigError("ReplaySafeToolNode: give awrap_tool_call with wrap_tool_call (the async graph needs it)")
    if ainner is None:
        return calls.awrap_tool_call

    async def wrapped(request: ToolCallRequest, execute: AsyncExecute) -> Result:
        assert ainner is not None
        return await calls.awrap_tool_call(request, lambda req: ainner(req, execute))

    return wrapped
