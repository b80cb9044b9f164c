"""The harness's own witness of tool bodies: what each tool declares and what its body did, learned without the
runtime's account of it.

The verdict must not take a broken runtime's word for what it judges. The runtime's tool events
(:class:`~tenxgraph.core.graph.utils.instrument.ToolEvent`, its ``ToolCallInfo``) say which effect class and
in-doubt policy a call had, whether its body failed, which idempotency key it was given, and how often it ran:
exactly what a broken ledger path or integration gets wrong. So, before the runtime sees the app, the harness
wraps each tool's own function (the body the user wrote) and writes, from inside it, one event per start and per
outcome to the cell's execution log (:mod:`pytest_replaysafe.judge.evidence`):

- ``body``: the body was entered, with the idempotency key its ``idempotency_key`` parameter actually received, and
  the tool's declaration as the app was built with it (``@tool(effect=..., on_in_doubt=...)``, the graph's
  in-doubt default applied at compile): its effect class and the in-doubt policy that declaration puts in force;
- ``body_end``: the body returned (``error`` when it raised, or returned a ``ToolOutput`` with ``is_error``);
- ``body_paused``: the body asked a person (``interrupt()``): it runs again once answered, by design.

The verdict compares them with the runtime's events (:mod:`pytest_replaysafe.judge.witnessed`). The call a body
belongs to is read from the tool-call context the body runs in (its assistant message and position): the harness's
identity of the call, as for every event.

An MCP tool's function is the integration's client code, not the tool's body, and its declaration is the
server's: for it the witness reads the server's own ``list_tools`` annotations (the SDK's ``Tool`` the integration
was given) and what the user told ``mcp_tools`` (``ToolOptions``), maps them itself as docs/mcp.md says, and
writes ``body`` and ``body_end`` (``via="mcp"``) where the official SDK sends the request
(``ClientSession.call_tool``): the key the server received in ``_meta``, and its ``isError``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from pytest_replaysafe.judge.evidence import Entry, ExecutionLog, call_id_of
from tenxgraph.core.tools.context import ToolCallInfo, current_tool_call
from tenxgraph.core.tools.interrupts import GraphInterrupt
from tenxgraph.core.tools.tool import IDEMPOTENCY_PARAM, Tool, ToolOutput

_MARK = "__replaysafe_witness__"
#: The execution log of the drive under way in this process (a forked child inherits it), or None.
_active: list[ExecutionLog] = []
#: Modules whose tools' functions are an integration's client code, not a body the user wrote.
_INTEGRATION_PREFIXES = ("tenxgraph.integrations.",)


def declared_policy(effect: str | None, on_in_doubt: str | None) -> str | None:
    """The in-doubt policy a declaration puts in force, as the docs of ``@tool`` state it: none for a tool that
    may simply run again (read, idempotent, transactional) or says ``"off"``; else its own, else ``"fail"`` for an
    external effect."""
    if effect in ("read", "idempotent", "transactional") or on_in_doubt == "off":
        return None
    return on_in_doubt or ("fail" if effect == "external" else None)


def install(app: Any, log: ExecutionLog) -> Callable[[], None]:
    """Witness the bodies of *app*'s tools into *log* until the returned function is called."""
    for tool in _tools_of(app):
        _wrap(tool)
    _active.append(log)

    def remove() -> None:
        _active.remove(log)

    return remove


def _tools_of(app: Any) -> Iterator[Tool]:
    yield from getattr(app, "tools", None) or ()  # a plain loop's: found by run.loop_app, before it runs
    for node in (getattr(app, "nodes", None) or {}).values():
        tools = getattr(node, "tools", None)
        if isinstance(tools, dict):
            yield from (t for t in tools.values() if isinstance(t, Tool))


def _wrap(tool: Tool) -> None:
    fn = tool.fn
    module = str(getattr(fn, "__module__", ""))
    if module == _MCP_TOOLS:
        _wrap_mcp(tool)
    if getattr(fn, _MARK, False) or module.startswith(_INTEGRATION_PREFIXES):
        return
    effect = tool.effect.value if tool.effect is not None else None
    declared = {"tool": tool.name, "effect": effect, "policy": declared_policy(effect, tool.on_in_doubt)}
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def body_async(*args: Any, **kwargs: Any) -> Any:
            with _watch(declared, kwargs) as returned:
                return returned(await fn(*args, **kwargs))

        wrapper: Callable[..., Any] = body_async
    else:

        @functools.wraps(fn)
        def body(*args: Any, **kwargs: Any) -> Any:
            with _watch(declared, kwargs) as returned:
                return returned(fn(*args, **kwargs))

        wrapper = body
    setattr(wrapper, _MARK, True)
    tool.fn = wrapper


@contextlib.contextmanager
def _watch(declared: dict[str, Any], kwargs: dict[str, Any]) -> Iterator[Callable[[Any], Any]]:
    """One body's run: ``body`` as it begins, then its outcome (the function given is called with its value)."""
    began = _began(declared, kwargs)

    def returned(value: Any) -> Any:
        _ended(began, "body_end", error=isinstance(value, ToolOutput) and value.is_error)
        return value

    try:
        yield returned
    except GraphInterrupt:
        _ended(began, "body_paused")
        raise
    except Exception:
        _ended(began, "body_end", error=True)
        raise


def _began(declared: dict[str, Any], kwargs: dict[str, Any]) -> Entry | None:
    """The ``body`` event written (None outside a drive, or outside a tool call's context)."""
    info = current_tool_call()
    if not _active or info is None:
        return None
    key = kwargs.get(IDEMPOTENCY_PARAM)
    entry = Entry(
        thread=info.thread_id,
        id=info.execution_id,
        event="body",
        tool=declared["tool"],
        policy=declared["policy"],
        effect=declared["effect"],
        ikey=key if isinstance(key, str) else None,
        call=call_id_of(info.message_id, info.index),
    )
    _active[-1].write(entry)
    return entry


def _ended(began: Entry | None, event: str, error: bool = False) -> None:
    if began is not None and _active:
        _active[-1].write(Entry(began.thread, began.id, event, began.tool, error=error, call=began.call))


# -- LangGraph tools: their metadata and what their node was told ---------------------------------------------------
def langgraph_declarations(app: Any) -> dict[str, tuple[str | None, str | None]]:
    """Tool name -> its effect class and in-doubt policy, for each tool of a ledger-guarded LangGraph ``ToolNode``
    in *app* (``ReplaySafeToolNode``, or a ``ToolNode`` wrapped by ``ReplaySafeToolCalls`` or the middleware): what
    its user told the node (``effects=``, ``on_in_doubt=``), else the tool's own ``metadata`` (``{"effect": ...}``,
    or the MCP annotations ``langchain-mcp-adapters`` puts there), mapped as docs/langgraph.md says. A tool in no
    such node is left out (its body events then carry no declaration)."""
    found: dict[str, tuple[str | None, str | None]] = {}
    for node in (getattr(app, "nodes", None) or {}).values():
        bound = getattr(node, "bound", node)
        tools = getattr(bound, "_tools_by_name", None)
        options = _guard_of(bound)
        if not isinstance(tools, dict) or options is None:
            continue
        for name, tool in tools.items():
            meta = getattr(tool, "metadata", None) or {}
            said = options.effects.get(name, meta.get("effect"))
            effect = str(getattr(said, "value", said)) if said is not None else _effect_from_hints(meta)
            found[name] = (effect, declared_policy(effect, options.on_in_doubt.get(name, meta.get("on_in_doubt"))))
    return found


def ledger_of(app: Any) -> Any:
    """The ledger the first ledger-guarded tool node of the LangGraph *app* records in (None: none guards)."""
    for node in (getattr(app, "nodes", None) or {}).values():
        options = _guard_of(getattr(node, "bound", node))
        if options is not None:
            return options.ledger
    return None


def _guard_of(node: Any) -> Any:
    """The ``ReplaySafeToolCalls`` that guards a LangGraph tool node, or None (a bare ``ToolNode``)."""
    from tenxgraph.integrations.langgraph.tools import ReplaySafeToolCalls

    seen: list[Any] = [getattr(node, "replay_safe", None), getattr(node, "_wrap_tool_call", None)]
    for _ in range(4):  # through a middleware's bound method and the closures that compose wrappers
        for item in seen:
            if isinstance(item, ReplaySafeToolCalls):
                return item
            calls = getattr(item, "calls", None)
            if isinstance(calls, ReplaySafeToolCalls):
                return calls
        seen = [getattr(i, "__self__", None) for i in seen] + [
            c.cell_contents for i in seen for c in (getattr(i, "__closure__", None) or ()) if c.cell_contents
        ]
    return None


def _effect_from_hints(meta: Mapping[str, Any]) -> str | None:
    """MCP annotations as docs/mcp.md maps them (either spelling): read-only → read, idempotent → idempotent, any
    other write → external; None when *meta* says none of them."""
    names = {"readOnlyHint": "read_only_hint", "idempotentHint": "idempotent_hint",
             "destructiveHint": "destructive_hint", "openWorldHint": "open_world_hint"}  # fmt: skip
    said = {k: meta.get(k, meta.get(v)) for k, v in names.items()}
    if all(v is None for v in said.values()):
        return None
    if said["readOnlyHint"]:
        return "read"
    return "idempotent" if said["idempotentHint"] else "external"


# -- MCP tools: the request the server received ----------------------------------------------------------------------
#: The request ``_meta`` entry that carries a call's idempotency key to an MCP server (docs/mcp.md).
MCP_KEY_META = "tenxgraph/idempotency-key"
_MCP_TOOLS = "tenxgraph.integrations.mcp.tools"


@dataclass(frozen=True)
class _Sent:
    """An MCP tool call on its way to the server: its ``body`` event (the key still to fill in), its arguments as
    the model gave them, and the argument a server tool takes its key in (left out when matching)."""

    body: Entry
    args: str
    key_argument: str


_lock = threading.Lock()
_sending: dict[str, list[_Sent]] = {}  # server tool name -> calls on their way (the SDK runs on its own thread)


def mcp_declaration(name: str, annotations: Any, options: Any, trusted: bool = True) -> tuple[str, str | None]:
    """An MCP tool's effect class and in-doubt policy, from what its user said (``ToolOptions``) and else the
    server's own annotations if the user trusts the server, as docs/mcp.md maps them: ``readOnlyHint`` → read,
    ``idempotentHint`` → idempotent, any other (or none, or an untrusted server's) → external."""
    said = options.effects.get(name)
    if said is not None:
        effect = str(getattr(said, "value", said))
    elif not trusted:
        effect = "external"
    elif annotations is not None and annotations.read_only_hint:
        effect = "read"
    elif annotations is not None and annotations.idempotent_hint:
        effect = "idempotent"
    else:
        effect = "external"
    return effect, declared_policy(effect, options.on_in_doubt.get(name))


def _wrap_mcp(tool: Tool) -> None:
    """Watch an MCP tool's calls where its server gets them: in the official SDK's ``ClientSession.call_tool``."""
    fn = tool.fn
    found = inspect.getclosurevars(fn).nonlocals
    listed, options, session = found.get("listed"), found.get("options"), found.get("session")
    if listed is None or options is None or getattr(fn, _MARK, False):
        return
    trusted = bool(getattr(session, "trusted", True))
    effect, policy = mcp_declaration(listed.name, listed.annotations, options, trusted)
    _watch_sdk()

    @functools.wraps(fn)
    async def call(**arguments: Any) -> Any:
        info = current_tool_call()
        if not _active or info is None:
            return await fn(**arguments)
        given = {k: v for k, v in arguments.items() if not isinstance(v, ToolCallInfo)}
        body = Entry(info.thread_id, info.execution_id, "body", tool.name, policy=policy, effect=effect,
                     call=call_id_of(info.message_id, info.index), via="mcp")  # fmt: skip
        sent = _Sent(body, _canonical(given), options.key_argument)
        with _lock:
            _sending.setdefault(listed.name, []).append(sent)
        try:
            return await fn(**arguments)
        finally:
            with _lock:
                if sent in _sending[listed.name]:
                    _sending[listed.name].remove(sent)

    setattr(call, _MARK, True)
    tool.fn = call


def _canonical(arguments: Mapping[str, Any]) -> str:
    return json.dumps(arguments, sort_keys=True, default=str)


def _claim(name: str, arguments: Mapping[str, Any] | None) -> _Sent | None:
    with _lock:
        for sent in _sending.get(name, []):
            given = {k: v for k, v in (arguments or {}).items() if k != sent.key_argument}
            if _canonical(given) == sent.args:
                _sending[name].remove(sent)
                return sent
    return None


def _watch_sdk() -> None:
    """Wrap the SDK's ``ClientSession.call_tool`` once per process: what was sent (the key in ``_meta``) and
    whether the server answered with an error (``isError``)."""
    from mcp.client.session import ClientSession

    original = ClientSession.call_tool
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    async def call_tool(self: Any, name: str, arguments: Any = None, *args: Any, **kwargs: Any) -> Any:
        sent = _claim(name, arguments)
        log = _active[-1] if _active else None
        if sent is None or log is None:
            return await original(self, name, arguments, *args, **kwargs)
        meta = kwargs.get("meta")
        key = meta.get(MCP_KEY_META) if isinstance(meta, Mapping) else None
        log.write(replace(sent.body, ikey=key if isinstance(key, str) else None))
        result = await original(self, name, arguments, *args, **kwargs)
        error = getattr(result, "is_error", None)
        if error is not None:
            log.write(Entry(sent.body.thread, sent.body.id, "body_end", sent.body.tool, error=bool(error),
                            call=sent.body.call, via="mcp"))  # fmt: skip
        return result

    setattr(call_tool, _MARK, True)
    ClientSession.call_tool = call_tool  # type: ignore[method-assign]
