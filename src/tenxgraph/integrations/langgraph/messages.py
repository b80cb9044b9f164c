"""LangGraph's messages as tenxgraph's: the assistant message a call belongs to (its ledger key's first half), and
a whole conversation, for the crash matrix's verdict."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, SystemMessage, ToolMessage

from tenxgraph.state.messages import JSON, Message, TextBlock, ToolCallBlock, ToolResultBlock


def text_of(content: str | list[Any]) -> str:
    """The text of a LangChain message's content (a string, or a list of blocks)."""
    if isinstance(content, str):
        return content
    parts = [b if isinstance(b, str) else str(b.get("text", "")) for b in content if isinstance(b, str | dict)]
    return "".join(parts)


def assistant_message(ai: AIMessage) -> Message:
    """*ai* as a tenxgraph assistant message with the same id and tool calls (ids kept, even missing ones)."""
    assert ai.id is not None
    calls = [ToolCallBlock(c.get("id"), c["name"], dict(c.get("args") or {})) for c in ai.tool_calls]
    return Message.assistant(text_of(ai.content), calls, message_id=ai.id)


def find_call(messages: Iterable[BaseMessage], tool_call_id: str | None) -> tuple[AIMessage, int] | None:
    """The latest assistant message that asked for *tool_call_id*, and the call's index in it (None: none did)."""
    for message in reversed(list(messages)):
        if isinstance(message, AIMessage) and message.tool_calls:
            for index, call in enumerate(message.tool_calls):
                if call.get("id") == tool_call_id:
                    return message, index
    return None


def messages_of(state: Any, key: str = "messages") -> list[BaseMessage]:
    """The messages of a ToolNode's input state: a list, a dict's *key*, or an object's attribute *key*."""
    if isinstance(state, list):
        return state
    if isinstance(state, dict):
        return list(state.get(key) or [])
    return list(getattr(state, key, None) or [])


def to_messages(messages: Sequence[BaseMessage]) -> list[Message]:
    """A LangGraph conversation as tenxgraph messages (roles, texts, tool calls and results, ids kept)."""
    out: list[Message] = []
    for m in messages:
        kw: dict[str, Any] = {"message_id": m.id} if m.id else {}
        if isinstance(m, AIMessage):
            calls = [ToolCallBlock(c.get("id"), c["name"], dict(c.get("args") or {})) for c in m.tool_calls]
            out.append(Message.assistant(text_of(m.content), calls, **kw))
        elif isinstance(m, ToolMessage):
            output: JSON = m.content if isinstance(m.content, str) else json.loads(json.dumps(m.content))
            result = ToolResultBlock(m.tool_call_id, output, m.status == "error", m.status)
            out.append(Message.tool(result, **kw))
        elif isinstance(m, SystemMessage):
            out.append(Message(role="system", content=(TextBlock(text_of(m.content)),), **kw))
        else:
            out.append(Message(role="user", content=(TextBlock(text_of(m.content)),), **kw))
    return out
