"""Model interface, the offline ScriptedModel and the provider registry."""

from tenxgraph.models.base import ChatModel
from tenxgraph.models.calls import generate
from tenxgraph.models.registry import known_providers, register_provider, resolve_model
from tenxgraph.models.scripted import Reply, ScriptedModel, ScriptExhaustedError
from tenxgraph.models.stream import MessageChunk, StreamingChatModel, ToolCallChunk

__all__ = [
    "ChatModel",
    "MessageChunk",
    "Reply",
    "ScriptExhaustedError",
    "ScriptedModel",
    "StreamingChatModel",
    "ToolCallChunk",
    "generate",
    "known_providers",
    "register_provider",
    "resolve_model",
]
