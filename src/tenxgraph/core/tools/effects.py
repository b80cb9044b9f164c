"""Effect classes: what a tool's effect is, and so what running it again means (see ``@tool(effect=...)``)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any


class Effect(StrEnum):
    """A tool's effect class. A ``str``: ``Effect.READ == "read"``, and ``effect="read"`` is accepted wherever an
    ``Effect`` is."""

    #: None: it may simply run again. No ledger record, no intent.
    READ = "read"
    #: It runs again with the same ``idempotency_key``, which the provider uses to apply it once.
    IDEMPOTENT = "idempotent"
    #: An effect outside that cannot simply run again: in-doubt detection is always on.
    EXTERNAL = "external"
    #: A write to the checkpointer's own database, committed with its record: exactly once.
    TRANSACTIONAL = "transactional"

    @property
    def may_run_again(self) -> bool:
        """Running it again is harmless (read), made harmless (idempotent) or impossible to do twice
        (transactional): it has nothing to be in doubt about."""
        return self is not Effect.EXTERNAL

    @classmethod
    def parse(cls, value: str | None) -> Effect | None:
        """*value* as an effect class (None stays None); a clear error naming the valid ones otherwise."""
        if value is None:
            return None
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"effect={value!r} is invalid; use one of {', '.join(e.value for e in cls)}") from None


#: MCP tool annotations (``ToolAnnotations``), by their JSON names and the Python SDK's field names.
MCP_HINTS = {
    "readOnlyHint": "read_only_hint",
    "destructiveHint": "destructive_hint",
    "idempotentHint": "idempotent_hint",
    "openWorldHint": "open_world_hint",
}


def effect_from_hints(hints: Mapping[str, Any]) -> Effect | None:
    """The effect class an MCP tool's annotations say, or None when *hints* holds none of them. Absent hints take
    the MCP spec's defaults (not read-only, destructive, not idempotent, open world): ``readOnlyHint`` → ``read``;
    ``idempotentHint`` → ``idempotent``; any other write → ``external`` (it cannot simply run again)."""

    def hint(name: str) -> Any:
        value = hints.get(name)
        return hints.get(MCP_HINTS[name]) if value is None else value

    if all(hint(name) is None for name in MCP_HINTS):
        return None
    if hint("readOnlyHint"):
        return Effect.READ
    return Effect.IDEMPOTENT if hint("idempotentHint") else Effect.EXTERNAL
