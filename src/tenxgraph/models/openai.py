"""OpenAI chat completions as a ChatModel (optional ``openai`` extra). ``base_url`` makes it work with any
OpenAI-compatible server.

Conversion both ways: our messages -> chat messages (assistant tool calls with their ids, tool results as ``tool``
messages); tool schemas -> ``{"type": "function", ...}``; the reply's tool calls keep the provider's ids as
``tool_call_id`` and their raw JSON arguments (the tool node parses and checks them). The reply always gets our own
fresh ``message_id``. Retries with backoff on 429 and 5xx, honouring ``Retry-After``, are the SDK's (``max_retries``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tenxgraph.models.base import require_api_key
from tenxgraph.state.messages import JSON, Message, TextBlock, ToolCallBlock
from tenxgraph.utils.constants import install_hint
from tenxgraph.utils.errors import ProviderUnavailableError

API_KEY_ENV = "OPENAI_API_KEY"


def to_openai_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role in ("user", "system"):
            out.append({"role": m.role, "content": m.text})
        elif m.role == "assistant":
            item: dict[str, Any] = {"role": "assistant", "content": m.text or None}
            if m.tool_calls:
                item["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {
                            "name": c.name,
                            "arguments": c.args if isinstance(c.args, str) else json.dumps(c.args),
                        },
                    }
                    for c in m.tool_calls
                ]
            out.append(item)
        else:  # tool results: one chat message per result
            for r in m.tool_results:
                content = r.output if isinstance(r.output, str) else json.dumps(r.output)
                out.append({"role": "tool", "tool_call_id": r.call_id, "content": content})
    return out


def to_openai_tools(tools: Sequence[dict[str, JSON]]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t["name"], "description": t.get("description", ""), "parameters": t["parameters"]},
        }
        for t in tools
    ]


def from_openai_message(message: Any) -> Message:
    blocks: list[TextBlock | ToolCallBlock] = []
    if getattr(message, "content", None):
        blocks.append(TextBlock(message.content))
    for call in getattr(message, "tool_calls", None) or []:
        blocks.append(ToolCallBlock(call.id, call.function.name, call.function.arguments or "{}"))
    return Message(role="assistant", content=tuple(blocks), metadata={"provider": "openai"})


class OpenAIChatModel:
    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int = 4,
        timeout: float = 120.0,
        **create_options: Any,
    ) -> None:
        try:
            import openai
        except ImportError as exc:
            raise ProviderUnavailableError(
                f'provider "openai" needs the openai extra: {install_hint("openai")} ({exc})'
            ) from exc
        key = require_api_key("openai", model, api_key, [API_KEY_ENV])
        self.model = model
        self.create_options = create_options
        self.client = openai.AsyncOpenAI(api_key=key, base_url=base_url, max_retries=max_retries, timeout=timeout)

    async def agenerate(self, messages: Sequence[Message], tools: Sequence[dict[str, JSON]]) -> Message:
        kwargs: dict[str, Any] = {"model": self.model, "messages": to_openai_messages(messages), **self.create_options}
        if tools:
            kwargs["tools"] = to_openai_tools(tools)
        response = await self.client.chat.completions.create(**kwargs)
        return from_openai_message(response.choices[0].message)
