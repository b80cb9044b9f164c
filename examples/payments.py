"""What the examples' tools call to make side effects: a payment/email/ticket provider.

``Provider`` is the interface (the crash-matrix ``effects`` fixture implements it, durably); ``LocalProvider``
keeps effects in memory for running the examples by hand.
"""

from __future__ import annotations

from typing import Any, Protocol


class Provider(Protocol):
    def apply(self, kind: str, payload: Any = None, idempotency_key: str | None = None) -> dict[str, Any]: ...


class LocalProvider:
    """An in-memory provider that honours idempotency keys, like a real payment API."""

    def __init__(self) -> None:
        self.effects: list[tuple[str, Any]] = []
        self._by_key: dict[str, dict[str, Any]] = {}

    def apply(self, kind: str, payload: Any = None, idempotency_key: str | None = None) -> dict[str, Any]:
        if idempotency_key is not None and idempotency_key in self._by_key:
            return {**self._by_key[idempotency_key], "applied": False}
        self.effects.append((kind, payload))
        result = {"effect_id": f"E-{len(self.effects)}", "applied": True}
        if idempotency_key is not None:
            self._by_key[idempotency_key] = result
        return result
