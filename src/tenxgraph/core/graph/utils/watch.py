"""What the ledger tells the run's observer (:mod:`tenxgraph.core.tools.observe`): each call's span, and each
result as it is recorded or replayed. Called by the ledger (:mod:`.invoke_node_handler`); it never calls back."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tenxgraph.core.graph.utils.ledger_record import LedgerCall, ToolExecution
from tenxgraph.core.tools.context import ToolCallInfo
from tenxgraph.core.tools.observe import RunObserver
from tenxgraph.core.tools.tracing import NO_SPAN, span


def attributes(info: ToolCallInfo, replayed: bool) -> dict[str, str | bool | int]:
    found: dict[str, str | bool | int] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": info.tool,
        "gen_ai.tool.type": "function",
        "tenxgraph.tool.replayed": replayed,
    }
    if info.call_id is not None:
        found["gen_ai.tool.call.id"] = info.call_id
    if info.key is not None:
        found["tenxgraph.ledger.key"] = info.key
    if info.effect is not None:
        found["tenxgraph.tool.effect"] = info.effect
    return found


def tool_span(observer: RunObserver | None, call: LedgerCall) -> contextlib.AbstractContextManager[Any | None]:
    """The span of a call the ledger runs (or answers without running: in doubt, unknown tool, bad arguments)."""
    tracer = observer.tracer if observer is not None else None
    return NO_SPAN if tracer is None else _tool_span(tracer, call)


@contextlib.contextmanager
def _tool_span(tracer: Any, call: LedgerCall) -> Iterator[Any]:
    with span(tracer, f"execute_tool {call.name}", attributes(call.info, False)) as traced:
        if traced is not None and call.in_doubt:
            traced.add_event("tenxgraph.tool.in_doubt", {"tenxgraph.ledger.key": call.key or ""})
        yield traced


def report(observer: RunObserver | None, info: ToolCallInfo, execution: ToolExecution, traced: Any = None) -> None:
    """A call's result is known (recorded, replayed, or unrecorded): to the stream, and onto its span (a replayed
    one gets a span of its own, since its body never ran)."""
    if observer is None or (observer.emit is None and observer.tracer is None):
        return
    if execution.replayed and observer.tracer is not None:
        with span(
            observer.tracer, f"execute_tool {info.tool}", {**attributes(info, True), "tenxgraph.tool.recorded": True}
        ):
            pass
    if traced is not None:
        traced.set_attribute("tenxgraph.tool.recorded", execution.recorded)
        if execution.result.is_error:
            traced.set_attribute("error.type", execution.result.status)
    observer.message(execution.message(), execution.replayed)
