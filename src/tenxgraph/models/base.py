"""The model interface the runtime calls: messages and tool schemas in, one assistant message out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from tenxgraph.core.state.messages import JSON, Message


@runtime_checkable
class ChatModel(Protocol):
    async def agenerate(self, messages: Sequence[Message], tools: Sequence[dict[str, JSON]]) -> Message:
        """Return the next assistant message. Give it a fresh ``message_id`` every time it is generated."""
        ...
