"""Model providers by name: ``ReactAgent(model="google/gemini-2.5-flash", provider="google")``.

A provider is a factory ``(model_name, **options) -> ChatModel``. Register your own with
:func:`register_provider`; :func:`resolve_model` turns a name (or passes a ChatModel through).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tenxgraph.models.base import ChatModel
from tenxgraph.utils.errors import ConfigError, UnknownProviderError

ProviderFactory = Callable[..., ChatModel]
_providers: dict[str, ProviderFactory] = {}


def register_provider(name: str, factory: ProviderFactory, *, replace: bool = False) -> None:
    if name in _providers and not replace:
        raise ValueError(f"provider {name!r} is already registered; pass replace=True to override it")
    _providers[name] = factory


def known_providers() -> list[str]:
    return sorted(_providers)


def resolve_model(model: str | ChatModel, provider: str | None = None, **options: Any) -> ChatModel:
    """A ChatModel from an instance, or from ``"provider/model"`` / ``model`` plus ``provider``."""
    if not isinstance(model, str):
        if isinstance(model, ChatModel):
            return model
        raise ConfigError(f"model must be a ChatModel or a model name string, got {type(model).__name__}")
    name = model
    if provider is None:
        provider, sep, _ = model.partition("/")
        if not sep:
            raise ConfigError(f"model {model!r} names no provider; write 'provider/model' or pass provider=")
    factory = _providers.get(provider)
    if factory is None:
        raise UnknownProviderError(
            f"unknown model provider {provider!r}; known providers: {', '.join(known_providers())}. "
            "Register one with tenxgraph.models.register_provider()"
        )
    return factory(name.removeprefix(f"{provider}/"), **options)


def _openai(model: str, **options: Any) -> ChatModel:
    from tenxgraph.models.openai import OpenAIChatModel

    return OpenAIChatModel(model, **options)


def _google(model: str, **options: Any) -> ChatModel:
    from tenxgraph.models.google import GoogleChatModel

    return GoogleChatModel(model, **options)


register_provider("google", _google)
register_provider("openai", _openai)
