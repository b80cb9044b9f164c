"""The harness's own view of an OpenAI Agents SDK agent's function calls (``framework="openai_agents"``), learned
without the runtime's account of them.

Before the first run, the harness wraps the ``on_invoke_tool`` of each ``agents.FunctionTool`` the test's run
function can reach (the agent it was given, through a ``functools.partial`` or a closure): the function the SDK
calls with the call's ``ToolContext``. ``replay_safe`` captures it in the copy it makes per run, so the wrapper
runs inside the ledger's call, where the body runs. It names the call as the harness does, from the SDK's own
context (the ``function_call`` item's id, or its ``call_id`` where the model gives items none, and the
``call_id``), and writes ``body`` (with the idempotency key the body can read) and ``body_end`` (what it
returned) to the cell's log. A call the ledger replays never reaches it.

On a bare agent (no ledger around the call) the wrapper also logs the call as unrecorded, with
``tool.before_invoke`` and ``tool.after_return`` fired around it and the effects it applies attributed to it, as
the watch of a bare Pydantic AI agent does. A tool's declaration is read from the tool itself, where
``declare()`` keeps it (effect class, in-doubt policy), and mapped by the harness; a tool declared only to
``replay_safe`` (per run) has none the harness can see: its entries say so (``UNDECLARED``), and the verdict
reads its declaration from the runtime's events. A tool that needs a person's approval on the tool itself
(``needs_approval=True``, read as the wrapper is made) has its bodies marked so (``cond="needs_approval"``): the
verdict finds a body of it that ran with no person asked (:mod:`pytest_replaysafe.judge.pauses`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pytest_replaysafe.judge.evidence import (
    UNDECLARED,
    Entry,
    ExecutionLog,
    call_id_of,
    fingerprint,
    preview,
    unrecorded,
)
from pytest_replaysafe.run.effects import loop_thread
from pytest_replaysafe.run.witness import declared_policy
from tenxgraph.core.crashpoints import crash_point
from tenxgraph.core.tools.context import ToolCallInfo, current_tool_call, running_call

_MARK = "__replaysafe_witness__"
#: The ``cond`` of a body whose tool needs a person's approval (``needs_approval=True`` on the tool).
NEEDS_APPROVAL = "needs_approval"
_FAKE_ID = "__fake_id__"  # (the SDK's stand-in id for an item a Chat Completions model gives none)


def is_function_tool(obj: object) -> bool:
    """An ``agents.FunctionTool``, told without importing the SDK."""
    return any(c.__name__ == "FunctionTool" and c.__module__ == "agents.tool" for c in type(obj).__mro__)


def witness_function_tools(tools: Iterable[Any], log: ExecutionLog) -> None:
    """Wrap each function tool's ``on_invoke_tool`` (once) so that its runs are written to *log*."""
    for tool in tools:
        invoke = tool.on_invoke_tool
        if getattr(invoke, _MARK, False):
            continue
        name = tool.name
        asks = NEEDS_APPROVAL if getattr(tool, "needs_approval", False) is True else None

        async def on_invoke_tool(
            ctx: Any, input: str, invoke: Any = invoke, name: str = name, tool: Any = tool, asks: str | None = asks
        ) -> Any:
            thread = loop_thread()
            if thread is None:  # (outside a cell's run)
                return await invoke(ctx, input)
            item_id = getattr(getattr(ctx, "tool_call", None), "id", None)
            message_id = item_id if item_id and item_id != _FAKE_ID else f"call:{ctx.tool_call_id}"
            info = current_tool_call()
            declared = _declared(tool)
            if info is not None:
                said = (thread, info.execution_id, message_id, name, declared, asks)
                return await _body(log, said, invoke, ctx, input)
            effect, policy = declared or (None, None)  # (nothing guards the call: its declaration is its own)
            bare = ToolCallInfo(thread, message_id, ctx.tool_call_id, name, 0, None, policy, effect)
            with running_call(bare):  # (its effects are attributed to it; the tool points fire in its window)
                crash_point("tool.before_invoke")
                _log(log, bare, "start")
                try:
                    said = (thread, bare.execution_id, message_id, name, declared, asks)
                    output = await _body(log, said, invoke, ctx, input)
                except Exception as exc:
                    _log(log, bare, "end", f"{type(exc).__name__}: {exc}", True)
                    raise
                _log(log, bare, "end", output)
                crash_point("tool.after_return")
                return output

        setattr(on_invoke_tool, _MARK, True)
        tool.on_invoke_tool = on_invoke_tool


def _declared(tool: Any) -> tuple[str | None, str | None] | None:
    """The tool's declaration, read by the harness where ``declare()`` keeps it on the tool (its effect class, and
    the in-doubt policy it puts in force, mapped as for ``@tool``); None: the tool declares nothing there."""
    found = getattr(tool, "__tenxgraph_declaration__", None)
    if not isinstance(found, tuple):
        return None
    return found[0], declared_policy(found[0], found[1])


async def _body(log: ExecutionLog, said: tuple[str, str, str, str, Any, str | None], invoke: Any, ctx: Any,
                input: str) -> Any:  # fmt: skip
    """One run of the body (*said*: thread, execution id, message id, tool, declaration, whether it needs
    approval): ``body`` as it begins (the key it can read), ``body_end`` with what it returned."""
    from tenxgraph.integrations.openai_agents import current_idempotency_key

    thread, eid, message_id, name, declared, asks = said
    call = call_id_of(message_id, 0)
    effect, policy = declared or (None, None)
    via = "openai_agents" if declared is not None else UNDECLARED
    log.write(Entry(thread, eid, "body", name, policy=policy, effect=effect, ikey=current_idempotency_key(),
                    call=call, via=via, cond=asks))  # fmt: skip
    try:
        output = await invoke(ctx, input)
    except Exception:
        log.write(Entry(thread, eid, "body_end", name, error=True, call=call, via=via))
        raise
    log.write(Entry(thread, eid, "body_end", name, fingerprint(output), call=call, via=via, out=preview(output)))
    return output


def _log(log: ExecutionLog, info: ToolCallInfo, event: str, output: Any = None, error: bool = False) -> None:
    log.write(unrecorded(info, event, output, error))
