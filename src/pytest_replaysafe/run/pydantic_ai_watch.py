"""The harness's own view of a Pydantic AI agent's tool calls, learned without the runtime's account of them.

- :class:`CallWatch`, a capability the harness passes with each run (``agent.run(..., capabilities=[watch])``): in
  Pydantic AI's ``wrap_tool_execute`` hook, outside any durability engine's toolset, it names each call as the
  harness does (the response that asked for it, by its place in the run's history, and the call's index there,
  read from ``ctx.messages``) and the tool's declaration (what the agent's ``LedgerDurability`` was told, else the
  tool's ``metadata``, mapped as docs/pydantic-ai.md says). On a bare agent (no ledger guards its calls) it logs
  each call as unrecorded, with ``tool.before_invoke`` and ``tool.after_return`` fired around it, as
  :mod:`.langgraph_watch` does for a bare ``ToolNode``.
- The witness of each function tool's body (:func:`witness_bodies`): the function the user wrote, wrapped where
  Pydantic AI calls it; it writes ``body`` (with the idempotency key the body can read,
  ``current_idempotency_key()``, and the declaration the watch found) and ``body_end`` to the cell's log. A call the
  ledger replays never reaches it. A body that pauses (it raises ``ApprovalRequired`` or ``CallDeferred``) ends
  with ``body_paused``: it runs again once answered, by design, and is no run of the call.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.toolsets import FunctionToolset

from pytest_replaysafe.judge.evidence import (
    UNDECLARED,
    Entry,
    ExecutionLog,
    call_id_of,
    fingerprint,
    preview,
    unrecorded,
)
from pytest_replaysafe.run.witness import _effect_from_hints, declared_policy
from tenxgraph.core.crashpoints import crash_point
from tenxgraph.core.tools.context import ToolCallInfo, current_tool_call, running_call

_MARK = "__replaysafe_witness__"
#: Pydantic AI's exceptions that pause a call (a body raises them until a person answers).
PAUSES = ("ApprovalRequired", "CallDeferred")


@dataclass(frozen=True)
class Calling:
    """A call as the harness names it: its thread, its call id (``call_id_of``) and its tool's declaration."""

    thread: str
    call: str
    tool: str
    declared: tuple[str | None, str | None] | None  # (effect, in-doubt policy); None: undeclared
    log: ExecutionLog


#: The call whose tool body runs now in this context, as the watch named it.
_calling: ContextVar[Calling | None] = ContextVar("replaysafe_pydantic_ai_call", default=None)


def asking(
    messages: Sequence[ModelMessage], call_id: str | None, latest: ModelResponse | None = None
) -> tuple[int, int] | None:
    """The place of the latest response in *messages* that asked for *call_id*, and the call's index in it; or
    *latest* (the run's last response, as the watch saw it) at the end of *messages*: ``run_stream`` runs the
    calls of a response that ends the run before that response joins the history."""
    for position, response in [*reversed([*enumerate(messages)]), (len(messages), latest)]:
        if isinstance(response, ModelResponse):
            calls = [p for p in response.parts if isinstance(p, ToolCallPart)]
            for index, part in enumerate(calls):
                if part.tool_call_id == call_id:
                    return position, index
    return None


def declaration(durability: Any, tool: str, metadata: Mapping[str, Any]) -> tuple[str | None, str | None] | None:
    """A tool's effect class and in-doubt policy as the agent declared them, read by the harness: the
    ``LedgerDurability``'s ``effects=`` / ``on_in_doubt=``, else the tool's ``metadata`` (an MCP tool's
    ``annotations`` there); None on a bare agent (nothing declares)."""
    if durability is None:
        return None
    said = durability.effects.get(tool, metadata.get("effect"))
    hints = metadata.get("annotations") or metadata
    effect = str(getattr(said, "value", said)) if said is not None else _effect_from_hints(hints)
    return effect, declared_policy(effect, durability.on_in_doubt.get(tool, metadata.get("on_in_doubt")))


@dataclass
class CallWatch(AbstractCapability[Any]):
    """Names each tool call of a run on *thread* (see the module's text); *guarded*: the agent's calls go through
    a ledger (its ``LedgerDurability``, *durability*), else the watch logs them as unrecorded."""

    thread: str
    log: ExecutionLog
    durability: Any = None
    latest: ModelResponse | None = None  # the run's last model response, as this watch saw it

    async def after_model_request(self, ctx: Any, *, request_context: Any, response: ModelResponse) -> ModelResponse:
        self.latest = response
        return response

    async def wrap_tool_execute(
        self, ctx: Any, *, call: ToolCallPart, tool_def: Any, args: Any, handler: Callable[[Any], Any]
    ) -> Any:
        found = asking(ctx.messages, call.tool_call_id, self.latest)
        if found is None:  # a tool called outside the agent's loop: not a call the model asked for
            return await handler(args)
        position, index = found
        from tenxgraph.integrations.pydantic_ai.backend import response_id

        message_id = response_id(position)
        declared = declaration(self.durability, call.tool_name, getattr(tool_def, "metadata", None) or {})
        token = _calling.set(Calling(self.thread, call_id_of(message_id, index), call.tool_name, declared, self.log))
        try:
            if self.durability is not None:
                return await handler(args)
            info = ToolCallInfo(self.thread, message_id, call.tool_call_id, call.tool_name, index, None)
            return await self._unguarded(info, args, handler)
        finally:
            _calling.reset(token)

    async def _unguarded(self, info: ToolCallInfo, args: Any, handler: Callable[[Any], Any]) -> Any:
        """A bare agent's call: logged as unrecorded (no ledger keeps its result), in its own crash window."""
        with running_call(info):  # (its effects are attributed to it; the tool points fire in its window)
            crash_point("tool.before_invoke")
            self._log(info, "start")
            try:
                output = await handler(args)
            except Exception as exc:
                self._log(info, "end", f"{type(exc).__name__}: {exc}", True)
                raise
            self._log(info, "end", output)
            crash_point("tool.after_return")
            return output

    def _log(self, info: ToolCallInfo, event: str, output: Any = None, error: bool = False) -> None:
        self.log.write(unrecorded(info, event, output, error))


# -- the bodies ----------------------------------------------------------------------------------------------------
def witness_bodies(agent: Any) -> None:
    """Wrap the function of each of *agent*'s function tools (once) so that its runs are written to the log of the
    call the watch named (see the module's text)."""

    def visit(toolset: Any) -> None:
        if isinstance(toolset, FunctionToolset):
            for tool in toolset.tools.values():
                _wrap(tool.function_schema)

    for toolset in agent.toolsets:
        toolset.apply(visit)


def _wrap(schema: Any) -> None:
    fn = schema.function
    if getattr(fn, _MARK, False):
        return
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def body_async(*args: Any, **kwargs: Any) -> Any:
            with _watch() as returned:
                return returned(await fn(*args, **kwargs))

        wrapper: Callable[..., Any] = body_async
    else:

        @functools.wraps(fn)
        def body(*args: Any, **kwargs: Any) -> Any:
            with _watch() as returned:
                return returned(fn(*args, **kwargs))

        wrapper = body
    setattr(wrapper, _MARK, True)
    schema.function = wrapper


@contextlib.contextmanager
def _watch() -> Iterator[Callable[[Any], Any]]:
    """One body's run: ``body`` as it begins (the key it can read), ``body_end`` as it ends, with what it returned
    (the function given is called with its value: the answer the model must be shown, whatever envelope a
    durability engine records it in)."""
    calling = _calling.get()
    if calling is None:  # outside a cell's run, or a call no watch named
        yield lambda value: value
        return
    from tenxgraph.integrations.pydantic_ai import current_idempotency_key

    info = current_tool_call()
    eid = info.execution_id if info is not None else calling.call
    effect, policy = calling.declared or (None, None)
    via = "pydantic_ai" if calling.declared is not None else UNDECLARED
    began = Entry(calling.thread, eid, "body", calling.tool, policy=policy, effect=effect,
                  ikey=current_idempotency_key(), call=calling.call, via=via)  # fmt: skip
    calling.log.write(began)

    def returned(value: Any) -> Any:
        calling.log.write(Entry(began.thread, eid, "body_end", began.tool, fingerprint(value), call=began.call,
                                via=via, out=preview(value)))  # fmt: skip
        return value

    try:
        yield returned
    except Exception as exc:
        paused = type(exc).__name__ in PAUSES  # (it asked for a person, or deferred its result: no run of it)
        calling.log.write(Entry(began.thread, eid, "body_paused" if paused else "body_end", began.tool,
                                error=not paused, call=began.call, via=via))  # fmt: skip
        raise
