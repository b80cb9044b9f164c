"""An MCP server's tools as tenxgraph tools: each call goes through the ledger like any tool's (key, check, invoke,
record), with its effect class read from the tool's MCP annotations, and the call's idempotency key sent to the
server in the request's ``_meta`` (and as an argument, where the tool declares one for it).

What an annotation means for a re-run (hints the server does not give take the MCP spec's defaults: not read-only,
destructive, not idempotent, open world):

- ``readOnlyHint`` → ``read``: no record; it may simply run again;
- ``idempotentHint`` (not read-only) → ``idempotent``: recorded; a re-run in a crash window sends the same key;
- anything else (a write that is not idempotent: destructive, open-world or additive) → ``external``: recorded,
  with an intent, and a call found in doubt after a crash is not run again (``on_in_doubt``, default ``"fail"``).

Any tool's class or in-doubt policy can be set instead (``effects=``, ``on_in_doubt=``, ``reconcile=``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mcp import types

from tenxgraph.integrations.mcp.checks import argument_checker, capped, checked_schema, description
from tenxgraph.integrations.mcp.session import MCPSession
from tenxgraph.ledger import Effect, Reconcile, Tool, ToolCallInfo, ToolOutput, check_policy, effect_from_hints, probe
from tenxgraph.state.messages import JSON
from tenxgraph.utils.errors import ConfigError
from tenxgraph.utils.sync import run_sync

#: Where the call's idempotency key travels in a ``tools/call`` request's ``_meta``.
KEY_META = "tenxgraph/idempotency-key"
_CONTEXT = "_tenxgraph_call"  # the parameter our tool function gets the call's context in (never shown)


def effect_of(annotations: types.ToolAnnotations | None, trusted: bool = True) -> Effect:
    """The effect class an MCP tool's annotations say (see the module's table; no annotation at all: the spec's
    defaults, a write that cannot simply run again). A server not *trusted* gets ``external`` whatever it says:
    its hints are hints, and a false ``readOnlyHint`` would have a write run again."""
    if not trusted:
        return Effect.EXTERNAL
    return effect_from_hints(annotations.model_dump() if annotations is not None else {}) or Effect.EXTERNAL


def output_of(result: types.CallToolResult) -> ToolOutput:
    """A tool result as the model sees it and the ledger records it: its structured content if it has some (a
    bare ``{"result": x}`` as ``x``), else its text, else its content blocks; ``isError`` kept."""
    structured = result.structured_content
    texts = [c.text for c in result.content if isinstance(c, types.TextContent)]
    content: JSON
    if structured is not None and not result.is_error:
        content = structured["result"] if set(structured) == {"result"} else structured
    elif len(texts) == len(result.content):
        content = "\n".join(texts)
    else:
        content = [c.model_dump(mode="json", exclude_none=True) for c in result.content]
    return ToolOutput(content, is_error=bool(result.is_error))


@dataclass(frozen=True)
class ToolOptions:
    """How :func:`mcp_tools` makes the server's tools ours: per tool name, an effect class, an in-doubt policy or
    a reconcile function instead of the annotations'; the argument a tool declares for the idempotency key; a
    prefix for every name (two servers with the same tool names, or names a model provider refuses)."""

    effects: Mapping[str, Effect | str] = field(default_factory=dict)
    on_in_doubt: Mapping[str, str] = field(default_factory=dict)
    reconcile: Mapping[str, Reconcile] = field(default_factory=dict)
    key_argument: str = "idempotency_key"
    prefix: str = ""


def to_tool(session: MCPSession, listed: types.Tool, options: ToolOptions) -> Tool:
    """One MCP tool as a :class:`~tenxgraph.Tool` whose calls go to *session*."""
    name = options.prefix + listed.name
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise ConfigError(
            f"MCP server {session.name!r} has a tool named {listed.name!r}, which is not 1-64 letters, digits, '_' "
            "or '-' (what model providers accept): give mcp_tools(..., prefix=...) or leave it out with only="
        )
    declared = options.effects.get(listed.name)
    policy, reconcile = options.on_in_doubt.get(listed.name), options.reconcile.get(listed.name)
    try:
        hinted = effect_of(listed.annotations, session.trusted)
        effect = check_policy(policy, reconcile, declared if declared is not None else hinted)
    except ValueError as exc:
        told = _in_options(str(exc), listed.name)
        raise ConfigError(f"MCP tool {listed.name!r} of server {session.name!r}: {told}") from None
    schema: dict[str, Any] = dict(listed.input_schema)
    properties = dict(schema.get("properties") or {})
    takes_key = options.key_argument in properties
    if takes_key:  # the runtime fills it in: the model never sees it
        properties.pop(options.key_argument)
        schema["required"] = [r for r in schema.get("required", []) if r != options.key_argument]
    schema["properties"] = properties
    schema = checked_schema(listed.name, session.name, schema)

    async def call(**arguments: Any) -> ToolOutput:
        info: ToolCallInfo = arguments.pop(_CONTEXT)
        if takes_key:
            arguments[options.key_argument] = info.idempotency_key
        result = await session.acall_tool(listed.name, arguments, {KEY_META: info.idempotency_key})
        probe.point("tool.in_flight")  # the server did what it did; the call has not returned yet
        return capped(output_of(result), listed.name, session.name)

    return Tool(
        name=name,
        description=description(listed.description or listed.title, session.name, listed.name),
        fn=call,
        parameters=schema,
        is_async=True,
        injected={_CONTEXT: "context"},
        on_in_doubt=policy,
        reconcile=reconcile,
        effect=effect,
        validate=argument_checker(listed.name, session.name, schema),
    )


async def amcp_tools(
    session: MCPSession, options: ToolOptions | None = None, *, only: list[str] | None = None
) -> list[Tool]:
    """The tools of *session*'s server (connecting to it), as tenxgraph tools; *only*: just these names."""
    options = options or ToolOptions()
    listed = await session.aconnect()
    names = {t.name for t in listed}
    named = {*options.effects, *options.on_in_doubt, *options.reconcile, *(only or [])}
    if named - names:
        raise ConfigError(
            f"MCP server {session.name!r} has no tool {sorted(named - names)}; its tools: {sorted(names)}"
        )
    return [to_tool(session, t, options) for t in listed if only is None or t.name in only]


def mcp_tools(session: MCPSession, options: ToolOptions | None = None, *, only: list[str] | None = None) -> list[Tool]:
    """:func:`amcp_tools` from sync code."""
    return run_sync(amcp_tools(session, options, only=only))


def _in_options(text: str, name: str) -> str:
    """A declaration error told in ``ToolOptions``' words (its fix is there, not in ``@tool(...)``)."""
    return (
        text.replace("drop on_in_doubt", f"drop {name!r} from ToolOptions(on_in_doubt=...)")
        .replace("say effect='external'", f"say ToolOptions(effects={{{name!r}: 'external'}})")
        .replace("needs reconcile=callable(", f"needs ToolOptions(reconcile={{{name!r}: fn(")
    )
