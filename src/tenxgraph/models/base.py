"""The model interface the runtime calls: messages and tool schemas in, one assistant message out."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from tenxgraph.state.messages import JSON, Message
from tenxgraph.utils.errors import ConfigError


@runtime_checkable
class ChatModel(Protocol):
    async def agenerate(self, messages: Sequence[Message], tools: Sequence[dict[str, JSON]]) -> Message:
        """Return the next assistant message. Give it a fresh ``message_id`` every time it is generated."""
        ...


def require_api_key(provider: str, model: str, api_key: str | None, env_vars: Sequence[str]) -> str:
    """*api_key*, or the first of *env_vars* that is set; a clear ConfigError (before any request) otherwise."""
    key = api_key or next((os.environ[e] for e in env_vars if os.environ.get(e)), None)
    if not key:
        raise ConfigError(
            f"provider {provider!r} (model {model!r}) needs an API key: set {' or '.join(env_vars)} or pass "
            "api_key=; no request was sent"
        )
    return key
