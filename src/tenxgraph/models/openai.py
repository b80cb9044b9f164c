"""OpenAI chat completions as a ChatModel (optional ``openai`` extra). ``base_url`` makes it work with any
OpenAI-compatible server (DeepSeek, Gemini's OpenAI endpoint, vLLM...).

Conversion both ways: our messages -> chat messages (assistant tool calls with their ids, tool results as ``tool``
messages; an assistant turn's ``refusal`` and ``reasoning_content`` go back as they came, since thinking models
refuse the next request without the latter); tool schemas -> ``{"type": "function", ...}``. The reply's tool calls
keep the provider's ids as ``tool_call_id`` (a call sent without one, or with ``""``, gets ``call_1``, ``call_2``...
by position: its key stays stable because the message id is ours and stored) and their raw JSON arguments (the tool
node parses and checks them). The reply always gets our own fresh ``message_id``, and says how it ended (see
:mod:`tenxgraph.models.stream`: finish reason, usage, refusal). Retries with backoff on 429 and 5xx, honouring
``Retry-After``, are the SDK's (``max_retries``).

Streaming (:meth:`OpenAIChatModel.astream`, used by ``stream_mode="messages"``, or for every call with
``stream=True``): tool-call argument deltas are joined by their ``index`` (``id`` and ``name`` come only in a
call's first chunk), parallel calls may interleave, and the usage chunk at the end is asked for.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from tenxgraph.models.base import require_api_key
from tenxgraph.models.stream import MessageChunk, ToolCallChunk, collect, ending, usage_of
from tenxgraph.state.messages import JSON, Message, TextBlock, ToolCallBlock, new_id
from tenxgraph.utils.constants import install_hint
from tenxgraph.utils.errors import ProviderUnavailableError

API_KEY_ENV = "OPENAI_API_KEY"
FINISH = {"stop": "stop", "tool_calls": "tool_calls", "function_call": "tool_calls", "length": "length"}
FINISH["content_filter"] = "content_filter"


def reasoning_of(message: Any) -> str | None:
    """A reply's reasoning: ``reasoning_content`` (DeepSeek, vLLM) or ``reasoning`` (gpt-oss servers, Ollama)."""
    for field in ("reasoning_content", "reasoning"):
        value = getattr(message, field, None)
        if value is None:
            value = (getattr(message, "model_extra", None) or {}).get(field)
        if isinstance(value, str) and value:
            return value
    return None


def to_openai_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role in ("user", "system"):
            out.append({"role": m.role, "content": m.text})
        elif m.role == "assistant":
            item: dict[str, Any] = {"role": "assistant", "content": m.text or None}
            if m.metadata.get("provider") == "openai":  # what this API sent is what it wants back
                for field, key in (("refusal", "refusal"), ("reasoning_content", "reasoning")):
                    if isinstance(m.metadata.get(key), str):
                        item[field] = m.metadata[key]
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


def _usage(usage: Any) -> dict[str, JSON]:
    if usage is None:
        return {}
    details = getattr(usage, "completion_tokens_details", None)
    reasoning = getattr(details, "reasoning_tokens", None)
    return usage_of(usage.prompt_tokens, usage.completion_tokens, usage.total_tokens, reasoning)


def _reply(
    message_id: str,
    text: str,
    calls: list[tuple[str | None, str, str]],
    finish: str | None,
    extra: dict[str, JSON],
) -> Message:
    """The assistant message of a reply: *calls* are (id, name, raw arguments); ids missing or empty get
    ``call_<n>``; *extra*: usage, refusal, reasoning, model."""
    blocks: list[TextBlock | ToolCallBlock] = [TextBlock(text)] if text else []
    for n, (call_id, name, args) in enumerate(calls, 1):
        blocks.append(ToolCallBlock(call_id or f"call_{n}", name, args or "{}"))
    reason = "refusal" if extra.get("refusal") else FINISH.get(finish, "other") if finish is not None else None
    metadata = ending("openai", reason, finish, extra)
    return Message(role="assistant", content=tuple(blocks), message_id=message_id, metadata=metadata)


def from_openai_message(
    message: Any, finish_reason: str | None = None, extra: dict[str, JSON] | None = None
) -> Message:
    """Our assistant message from a chat-completion ``message`` (and its choice's finish reason)."""
    calls = [(c.id, c.function.name, c.function.arguments) for c in getattr(message, "tool_calls", None) or []]
    said = {"refusal": getattr(message, "refusal", None), "reasoning": reasoning_of(message)}
    return _reply(new_id(), getattr(message, "content", None) or "", calls, finish_reason, {**said, **(extra or {})})


class OpenAIStream:
    """The chunks of one streamed reply, joined: call pieces by their ``index``, whatever order they come in."""

    def __init__(self) -> None:
        self.message_id = new_id()
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.refusal: list[str] = []
        self.calls: dict[int, list[Any]] = {}  # index -> its current call: [id, name, argument pieces]
        self.slots: list[list[Any]] = []  # every call, in the order it began
        self.order: list[int] = []  # (their identities: a chunk's position)
        self.finish: str | None = None
        self.usage: dict[str, JSON] = {}
        self.model: str | None = None

    def add(self, chunk: Any) -> list[MessageChunk]:
        out: list[MessageChunk] = []
        self.model = getattr(chunk, "model", None) or self.model
        if getattr(chunk, "usage", None) is not None:
            self.usage = _usage(chunk.usage)
        for choice in chunk.choices or []:
            if choice.index != 0:
                continue
            delta = choice.delta
            if delta.content:
                self.text.append(delta.content)
                out.append(MessageChunk(self.message_id, text=delta.content))
            if getattr(delta, "refusal", None):
                self.refusal.append(delta.refusal)
            if reasoning := reasoning_of(delta):
                self.reasoning.append(reasoning)
                out.append(MessageChunk(self.message_id, reasoning=reasoning))
            for piece in delta.tool_calls or []:
                slot = self._slot(piece.index, piece.id)
                function = piece.function
                name = function.name if function is not None else None
                args = (function.arguments if function is not None else None) or ""
                slot[0] = piece.id or slot[0]
                slot[1] = name or slot[1]
                slot[2].append(args)
                position = self.order.index(id(slot))
                out.append(
                    MessageChunk(self.message_id, tool_call=ToolCallChunk(position, piece.id or None, name, args))
                )
            self.finish = choice.finish_reason or self.finish
        return out

    def _slot(self, index: int, call_id: str | None) -> list[Any]:
        """The call a piece belongs to: by its ``index``, unless it brings an id other than the one that index
        has (Ollama streams parallel calls all with ``index`` 0: each new id is a new call)."""
        slot = self.calls.get(index)
        if slot is None or (call_id and slot[0] and call_id != slot[0]):
            slot = [None, "", []]
            self.calls[index] = slot
            self.slots.append(slot)
            self.order.append(id(slot))
        return slot

    def message(self) -> Message:
        calls = [(c[0], c[1], "".join(c[2])) for c in self.slots]
        extra: dict[str, JSON] = {"usage": self.usage, "model": self.model}
        extra |= {"refusal": "".join(self.refusal), "reasoning": "".join(self.reasoning)}
        return _reply(self.message_id, "".join(self.text), calls, self.finish, extra)


class OpenAIChatModel:
    #: The provider, as OpenTelemetry's GenAI conventions name it (``gen_ai.provider.name``).
    provider = "openai"

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
        """*create_options* go to ``chat.completions.create``; ``stream=True`` streams every call (the reply is
        the same message)."""
        try:
            import openai
        except ImportError as exc:
            raise ProviderUnavailableError(
                f'provider "openai" needs the openai extra: {install_hint("openai")} ({exc})'
            ) from exc
        key = require_api_key("openai", model, api_key, [API_KEY_ENV])
        self.model = model
        self.stream = bool(create_options.pop("stream", False))
        self.create_options = create_options
        self.client = openai.AsyncOpenAI(api_key=key, base_url=base_url, max_retries=max_retries, timeout=timeout)

    def _request(self, messages: Sequence[Message], tools: Sequence[dict[str, JSON]]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": self.model, "messages": to_openai_messages(messages), **self.create_options}
        if tools:
            kwargs["tools"] = to_openai_tools(tools)
        return kwargs

    async def agenerate(self, messages: Sequence[Message], tools: Sequence[dict[str, JSON]]) -> Message:
        if self.stream:
            return await collect(self.astream(messages, tools))
        response = await self.client.chat.completions.create(**self._request(messages, tools))
        choice = response.choices[0]
        extra: dict[str, JSON] = {"usage": _usage(response.usage), "model": response.model}
        return from_openai_message(choice.message, choice.finish_reason, extra)

    async def astream(
        self, messages: Sequence[Message], tools: Sequence[dict[str, JSON]]
    ) -> AsyncIterator[MessageChunk | Message]:
        kwargs = self._request(messages, tools)
        kwargs["stream"] = True
        kwargs.setdefault("stream_options", {"include_usage": True})
        reply = OpenAIStream()
        async with await self.client.chat.completions.create(**kwargs) as stream:
            async for chunk in stream:
                for piece in reply.add(chunk):
                    yield piece
        yield reply.message()
