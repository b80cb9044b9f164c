"""The watcher of tool calls no ledger guards: a LangGraph ``ToolNode``'s calls, seen through LangChain's
callbacks, logged as unrecorded with the harness's call identity, with ``tool.before_invoke`` and
``tool.after_return`` fired around each (see :class:`ToolWatch` in :func:`tool_watch`)."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack
from typing import Any
from uuid import UUID

from pytest_replaysafe.judge.evidence import (
    UNDECLARED,
    Entry,
    ExecutionLog,
    call_id_of,
    unrecorded,
)
from tenxgraph.core.crashpoints import crash_point
from tenxgraph.core.tools.context import ToolCallInfo, current_tool_call, running_call


def tool_watch(log: ExecutionLog, thread: str, declarations: Mapping[str, tuple[str | None, str | None]]) -> Any:
    """A LangChain callback handler for one run on *thread* (see :class:`ToolWatch`); *declarations*: each guarded
    tool's effect class and in-doubt policy, as the witness read them from the app
    (:func:`~pytest_replaysafe.run.witness.langgraph_declarations`)."""
    from langchain_core.callbacks import BaseCallbackHandler

    from tenxgraph.integrations.langgraph.messages import find_call, messages_of

    class ToolWatch(BaseCallbackHandler):
        """Logs the calls no ledger guards, and fires the tool crash points around them."""

        run_inline = True  # in the tool's own thread and context, before and after its body
        raise_error = True

        def __init__(self) -> None:
            self.inputs: dict[UUID, Any] = {}
            self.parents: dict[UUID, UUID | None] = {}
            self.calls: dict[UUID, tuple[ToolCallInfo, ExitStack]] = {}
            self.bodies: dict[UUID, Entry] = {}  # ledger-guarded calls under way: their witness's body event

        def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID, **kw: Any) -> None:
            self.inputs[run_id], self.parents[run_id] = inputs, kw.get("parent_run_id")

        def _find(self, parent: UUID | None, tool_call_id: str | None) -> tuple[str, int] | None:
            while parent is not None:
                found = find_call(messages_of(self.inputs.get(parent)), tool_call_id)
                if found is not None and found[0].id is not None:
                    return found[0].id, found[1]
                parent = self.parents.get(parent)
            return None

        def on_tool_start(self, serialized: Any, input_str: str, *, run_id: UUID, **kw: Any) -> None:
            name, call_id = str((serialized or {}).get("name")), kw.get("tool_call_id")
            found = self._find(kw.get("parent_run_id"), call_id)
            if found is None:
                return  # a tool called outside a tool node: not a call the model asked for
            guarded = current_tool_call()
            if guarded is not None:  # a ReplaySafeToolNode call: the ledger logs it; the witness sees its body
                self.bodies[run_id] = self._witness(guarded, found, name)
                return
            message_id, index = found
            info = ToolCallInfo(thread, message_id, call_id, name, index, None)  # no ledger key: none guards it
            stack = ExitStack()
            stack.enter_context(running_call(info))  # the call's crash window; its effects are attributed to it
            try:
                crash_point("tool.before_invoke")
            except BaseException:
                stack.close()
                raise
            self._log(info, "start")
            self.calls[run_id] = (info, stack)

        def on_tool_end(self, output: Any, *, run_id: UUID, **kw: Any) -> None:
            self._ended(run_id, getattr(output, "content", output), getattr(output, "status", None) == "error")

        def on_tool_error(self, error: BaseException, *, run_id: UUID, **kw: Any) -> None:
            from langgraph.errors import GraphBubbleUp

            if isinstance(error, GraphBubbleUp):  # it asked a person (interrupt()): it runs again once answered
                self._paused(run_id)
                return
            self._ended(run_id, f"{type(error).__name__}: {error}", True)

        def _paused(self, run_id: UUID) -> None:
            body = self.bodies.pop(run_id, None)
            if body is not None:
                log.write(Entry(body.thread, body.id, "body_paused", body.tool, call=body.call, via=body.via))
            found = self.calls.pop(run_id, None)
            if found is not None:
                info, stack = found
                self._log(info, "paused")
                stack.close()

        def _witness(self, info: ToolCallInfo, found: tuple[str, int], name: str) -> Entry:
            """The harness's own view of a body the ledger runs: the key it gets (``current_idempotency_key()``
            in its context) and, at its end, its outcome (LangGraph's ``ToolMessage.status``, or its error)."""
            from tenxgraph.integrations.langgraph import current_idempotency_key

            call, key = call_id_of(*found), current_idempotency_key()
            if name in declarations:
                effect, policy = declarations[name]
                body = Entry(info.thread_id, info.execution_id, "body", name, policy=policy, effect=effect, ikey=key,
                             call=call, via="langgraph")  # fmt: skip
            else:
                body = Entry(info.thread_id, info.execution_id, "body", name, ikey=key, call=call, via=UNDECLARED)
            log.write(body)
            return body

        def _ended(self, run_id: UUID, output: Any, error: bool) -> None:
            body = self.bodies.pop(run_id, None)
            if body is not None:
                log.write(Entry(body.thread, body.id, "body_end", body.tool, error=error, call=body.call, via=body.via))
            found = self.calls.pop(run_id, None)
            if found is None:
                return
            info, stack = found
            self._log(info, "end", output, error)
            with stack:
                crash_point("tool.after_return")

        def _log(self, info: ToolCallInfo, event: str, output: Any = None, error: bool = False) -> None:
            log.write(unrecorded(info, event, output, error))

    return ToolWatch()
