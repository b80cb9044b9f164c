"""Model interface, the offline ScriptedModel and the provider registry."""

from tenxgraph.models.base import ChatModel
from tenxgraph.models.registry import known_providers, register_provider, resolve_model
from tenxgraph.models.scripted import Reply, ScriptedModel, ScriptExhaustedError

__all__ = [
    "ChatModel",
    "Reply",
    "ScriptExhaustedError",
    "ScriptedModel",
    "known_providers",
    "register_provider",
    "resolve_model",
]
