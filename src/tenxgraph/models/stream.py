"""Token streaming and what a model turn ended with, shared by the provider wrappers.

A model that can stream implements :class:`StreamingChatModel`: ``astream(messages, tools)`` yields
:class:`MessageChunk` pieces as they arrive (answer text, reasoning text, tool-call argument deltas) and, last, the
complete assistant :class:`~tenxgraph.state.messages.Message`, whose ``message_id`` every chunk carries.

Every provider's reply says how it ended, in ``message.metadata``: ``finish_reason`` (one of
:data:`FINISH_REASONS`, the same words for every provider), ``provider_finish_reason`` (the provider's own word),
``usage`` (``input_tokens``, ``output_tokens``, ``total_tokens``, and ``reasoning_tokens`` when the provider
counts them), ``refusal`` (the text of a refusal), ``reasoning`` (thinking text the provider returned). A turn that
did not end as the model meant (:data:`UNFINISHED`) is logged as a ``model_unfinished`` event, and
:attr:`tenxgraph.RunResult.outcome` names it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from tenxgraph.models.base import ChatModel
from tenxgraph.state.messages import JSON, Message
from tenxgraph.utils.events import emit_event

#: How a model turn ended, in the same words for every provider.
FINISH_REASONS = ("stop", "tool_calls", "length", "content_filter", "refusal", "blocked", "error")
#: Endings the caller must see: the answer was cut (``length``), filtered (``content_filter``), refused
#: (``refusal``), or the prompt itself was blocked (``blocked``).
UNFINISHED = frozenset({"length", "content_filter", "refusal", "blocked", "error", "other"})


@dataclass(frozen=True, slots=True)
class ToolCallChunk:
    """A piece of one tool call: ``index`` tells parallel calls apart; ``id`` and ``name`` come with the first piece
    of a call (None after), ``args`` is a piece of its JSON arguments."""

    index: int
    id: str | None = None
    name: str | None = None
    args: str = ""


@dataclass(frozen=True, slots=True)
class MessageChunk:
    """A piece of an assistant message as the model streams it: answer text, reasoning text or a tool-call piece.
    Every chunk of one message has that message's ``message_id``."""

    message_id: str
    text: str = ""
    reasoning: str = ""
    tool_call: ToolCallChunk | None = None

    @property
    def role(self) -> str:
        return "assistant"


@runtime_checkable
class StreamingChatModel(ChatModel, Protocol):
    def astream(
        self, messages: Sequence[Message], tools: Sequence[dict[str, JSON]]
    ) -> AsyncIterator[MessageChunk | Message]:
        """Yield the reply's chunks as they arrive, then the complete message (with the chunks' ``message_id``)."""
        ...


async def collect(stream: AsyncIterator[MessageChunk | Message]) -> Message:
    """The complete message at the end of a :meth:`StreamingChatModel.astream` (its chunks dropped)."""
    message: Message | None = None
    async for item in stream:
        if isinstance(item, Message):
            message = item
    if message is None:
        raise RuntimeError("the model's stream ended without its complete message")
    return message


def usage_of(input_tokens: object, output_tokens: object, total: object, reasoning: object) -> dict[str, JSON]:
    """Token counts in our words, leaving out the ones the provider did not send."""
    pairs = {"input_tokens": input_tokens, "output_tokens": output_tokens, "total_tokens": total}
    pairs["reasoning_tokens"] = reasoning
    return {k: v for k, v in pairs.items() if isinstance(v, int) and not isinstance(v, bool)}


def ending(
    provider: str, finish_reason: str | None, provider_reason: str | None, extra: Mapping[str, JSON]
) -> dict[str, JSON]:
    """A reply's metadata: the provider, how it ended and what else it said (``usage``, ``refusal``, ...; empty
    values left out). A turn that did not end as the model meant is logged as a ``model_unfinished`` event."""
    metadata: dict[str, JSON] = {"provider": provider}
    if finish_reason is not None:
        metadata["finish_reason"] = finish_reason
    if provider_reason is not None:
        metadata["provider_finish_reason"] = provider_reason
    metadata.update({k: v for k, v in extra.items() if v not in (None, "", {}, [])})
    if finish_reason in UNFINISHED:
        emit_event(
            "model_unfinished", logging.WARNING, provider=provider, finish_reason=finish_reason,
            provider_finish_reason=provider_reason, hint=UNFINISHED_HINTS[finish_reason],
        )  # fmt: skip
    return metadata


UNFINISHED_HINTS = {
    "length": "the reply was cut at the token limit: raise max_tokens (its tool-call arguments may be incomplete)",
    "content_filter": "the provider's safety filter stopped the reply",
    "refusal": "the model refused: message.metadata['refusal'] has its words",
    "blocked": "the provider blocked the prompt itself: message.metadata['block_reason'] says why",
    "error": "the provider could not produce a valid reply (e.g. a malformed function call)",
    "other": "the provider ended the reply for a reason not known to be an answer: provider_finish_reason says it",
}
