"""A Pydantic AI conversation (``result.all_messages()``) as tenxgraph messages: each response an assistant message
with the ledger's id for it (``response:{p}``, its place in the history, as :mod:`.backend` keys its calls), each
tool return, retry prompt or failure a tool result of its call. What the crash matrix judges a Pydantic AI run by,
and what a user reads the ledger's view of a run with."""

from __future__ import annotations

import json
from collections.abc import Sequence

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from tenxgraph.integrations.pydantic_ai.backend import response_id
from tenxgraph.state.messages import JSON, Message, ToolCallBlock, ToolResultBlock

__all__ = ["to_messages"]


def to_messages(messages: Sequence[ModelMessage]) -> list[Message]:
    """*messages* as tenxgraph messages: roles, texts, tool calls (their ``tool_call_id``) and their results."""
    out: list[Message] = []
    for position, message in enumerate(messages):
        if isinstance(message, ModelResponse):
            text = "".join(p.content for p in message.parts if isinstance(p, TextPart))
            calls = [ToolCallBlock(p.tool_call_id, p.tool_name, p.args_as_dict())
                     for p in message.parts if isinstance(p, ToolCallPart)]  # fmt: skip
            out.append(Message.assistant(text, calls, message_id=response_id(position)))
            continue
        assert isinstance(message, ModelRequest)
        for part in message.parts:
            if isinstance(part, ToolReturnPart):
                failed = part.outcome not in ("success",)
                result = ToolResultBlock(part.tool_call_id, _json(part.content), failed, part.outcome)
                out.append(Message.tool(result))
            elif isinstance(part, RetryPromptPart) and part.tool_name is not None:
                said = part.content if isinstance(part.content, str) else _json(part.content)
                out.append(Message.tool(ToolResultBlock(part.tool_call_id, said, True, "retry")))
            elif isinstance(part, UserPromptPart):
                out.append(Message.user(part.content if isinstance(part.content, str) else str(part.content)))
            elif isinstance(part, SystemPromptPart):
                out.append(Message.system(part.content))
    return out


def _json(value: object) -> JSON:
    """A tool's return value as JSON (what it is when stored: a string, or its JSON form)."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return json.loads(json.dumps(value, default=str))
