"""Conversation messages and their content blocks.

Every message has a ``message_id`` generated once, when the message is created, and kept through every
JSON round trip. The replay-safe tool ledger keys tool calls by ``"{message_id}:{tool_call_id}"``, so the id
must never be regenerated for a stored message.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from tenxgraph.utils.constants import MESSAGE_ID_MAX_BYTES
from tenxgraph.utils.errors import SerializationError

Role: TypeAlias = Literal["user", "assistant", "system", "tool"]
ResultStatus: TypeAlias = Literal["success", "error", "timeout", "replayed_error"]
ROLES: frozenset[str] = frozenset({"user", "assistant", "system", "tool"})

JSON: TypeAlias = Any
"""A value that ``json.dumps`` accepts and that round-trips through ``json.loads`` unchanged."""


def id_problem(value: object, max_bytes: int) -> str | None:
    """Why *value* cannot be an id on every backend (None if it can): ids are non-empty strings of valid UTF-8
    without NUL characters, at most *max_bytes* long."""
    if not isinstance(value, str) or not value:
        return f"must be a non-empty string, got {value!r}"
    if "\x00" in value:
        return "must not contain a NUL character (\\x00): PostgreSQL cannot store one"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return f"must be valid UTF-8: {exc.reason} at position {exc.start}"
    if size > max_bytes:
        return f"is {size} bytes long; the limit is {max_bytes} bytes (UTF-8) on every backend"
    return None


def new_id(prefix: str = "msg") -> str:
    """A fresh, globally unique id."""
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(frozen=True, slots=True)
class TextBlock:
    text: str

    def to_dict(self) -> dict[str, JSON]:
        return {"type": "text", "text": self.text}


@dataclass(frozen=True, slots=True)
class ToolCallBlock:
    """A tool call the assistant asked for. ``args`` is a dict, or the raw JSON text a provider sent."""

    id: str | None
    name: str
    args: dict[str, JSON] | str = field(default_factory=dict)

    def __post_init__(self) -> None:
        problem = id_problem(self.id, MESSAGE_ID_MAX_BYTES) if self.id is not None else None
        if problem is not None:
            raise ValueError(f"tool_call_id of {self.name!r} {problem}")

    def to_dict(self) -> dict[str, JSON]:
        return {"type": "tool_call", "id": self.id, "name": self.name, "args": self.args}


@dataclass(frozen=True, slots=True)
class ToolResultBlock:
    """The result of one tool call, as the model sees it."""

    call_id: str | None
    output: JSON
    is_error: bool = False
    status: str = "success"

    def to_dict(self) -> dict[str, JSON]:
        return {
            "type": "tool_result",
            "call_id": self.call_id,
            "output": self.output,
            "is_error": self.is_error,
            "status": self.status,
        }


ContentBlock: TypeAlias = TextBlock | ToolCallBlock | ToolResultBlock


def block_from_dict(data: dict[str, JSON]) -> ContentBlock:
    kind = data.get("type")
    if kind == "text":
        return TextBlock(text=data["text"])
    if kind == "tool_call":
        return ToolCallBlock(id=data.get("id"), name=data["name"], args=data.get("args", {}))
    if kind == "tool_result":
        return ToolResultBlock(
            call_id=data.get("call_id"),
            output=data.get("output"),
            is_error=bool(data.get("is_error", False)),
            status=data.get("status", "success"),
        )
    raise SerializationError(f"unknown content block type {kind!r}; expected text, tool_call or tool_result")


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a conversation. Immutable: build a new message instead of editing one."""

    role: Role
    content: tuple[ContentBlock, ...] = ()
    message_id: str = field(default_factory=new_id)
    metadata: dict[str, JSON] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"Message role {self.role!r} is invalid; use one of {sorted(ROLES)}")
        if not isinstance(self.content, tuple):
            object.__setattr__(self, "content", tuple(self.content))
        problem = id_problem(self.message_id, MESSAGE_ID_MAX_BYTES)
        if problem is not None:
            raise ValueError(f"Message.message_id {problem} (leave it out to generate one)")

    # -- constructors -----------------------------------------------------------------------------------
    @classmethod
    def text_message(cls, text: str, role: Role = "user", **kw: Any) -> Message:
        return cls(role=role, content=(TextBlock(text),), **kw)

    @classmethod
    def user(cls, text: str, **kw: Any) -> Message:
        return cls.text_message(text, "user", **kw)

    @classmethod
    def system(cls, text: str, **kw: Any) -> Message:
        return cls.text_message(text, "system", **kw)

    @classmethod
    def assistant(cls, text: str = "", tool_calls: list[ToolCallBlock] | None = None, **kw: Any) -> Message:
        blocks: list[ContentBlock] = [TextBlock(text)] if text else []
        blocks.extend(tool_calls or ())
        return cls(role="assistant", content=tuple(blocks), **kw)

    @classmethod
    def tool(cls, result: ToolResultBlock, **kw: Any) -> Message:
        return cls(role="tool", content=(result,), **kw)

    # -- views ------------------------------------------------------------------------------------------
    @property
    def text(self) -> str:
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    @property
    def tool_calls(self) -> list[ToolCallBlock]:
        return [b for b in self.content if isinstance(b, ToolCallBlock)]

    @property
    def tool_results(self) -> list[ToolResultBlock]:
        return [b for b in self.content if isinstance(b, ToolResultBlock)]

    # -- JSON -------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, JSON]:
        data: dict[str, JSON] = {
            "message_id": self.message_id,
            "role": self.role,
            "content": [b.to_dict() for b in self.content],
        }
        if self.metadata:
            data["metadata"] = self.metadata
        return data

    @classmethod
    def from_dict(cls, data: dict[str, JSON]) -> Message:
        try:
            return cls(
                role=data["role"],
                content=tuple(block_from_dict(b) for b in data.get("content", ())),
                message_id=data["message_id"],
                metadata=dict(data.get("metadata") or {}),
            )
        except KeyError as exc:
            raise SerializationError(f"message data is missing the field {exc.args[0]!r}: {data!r}") from None

    def to_json(self) -> str:
        return dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> Message:
        return cls.from_dict(json.loads(text))


def _first_unstorable(value: object, trail: tuple[tuple[object, object], ...] = ()) -> tuple[tuple, object] | None:  # type: ignore[type-arg]
    """The first value JSON cannot hold inside *value*, with the (container, key) pairs that lead to it."""
    if value is None or isinstance(value, str | bool | int):
        return None
    if isinstance(value, float):
        return None if value == value and value not in (float("inf"), float("-inf")) else (trail, value)
    if isinstance(value, dict):
        for key, item in value.items():
            found = _first_unstorable(item, (*trail, (value, key))) if isinstance(key, str) else ((*trail,), key)
            if found is not None:
                return found
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _first_unstorable(item, (*trail, (value, index)))
            if found is not None:
                return found
        return None
    return trail, value


def _where_unstorable(value: object) -> str | None:
    """Where the value JSON cannot hold is, said as a person would fix it: a tool call's argument by tool and
    argument name, else its path."""
    found = _first_unstorable(value)
    if found is None:
        return None
    trail, bad = found
    kind = type(bad).__name__
    for n, (container, key) in enumerate(trail):
        if key == "args" and isinstance(container, dict) and container.get("type") == "tool_call":
            arg = trail[n + 1][1] if n + 1 < len(trail) else None
            return (
                f"tool call {container.get('name')!r} (id {container.get('id')!r}) has argument {arg!r} = {bad!r}, a "
                f"{kind}: tool-call arguments must be JSON values (a string, number, bool, null, list or object; "
                "for a date, its ISO string)"
            )
    path = "".join(f"[{k!r}]" if isinstance(k, str) else f"[{k}]" for _, k in trail)
    return f"value{path} = {bad!r} is a {kind}, which JSON cannot hold (convert it to a string or number)"


# A NUL escape that is not itself an escaped backslash followed by "u0000".
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def dumps(value: JSON, what: str = "value") -> str:
    """``json.dumps`` that raises a :class:`SerializationError` naming *what* could not be stored.

    One rule for every backend: besides JSON's own limits, no string may hold a NUL character (PostgreSQL refuses
    it) or a lone surrogate (not valid UTF-8: SQLite and PostgreSQL both refuse it)."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"{what} is not JSON-serialisable: {_where_unstorable(value) or exc}") from exc
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise SerializationError(f"{what} cannot be stored: a string contains a NUL character (\\x00)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end]
        raise SerializationError(
            f"{what} cannot be stored: a string is not valid UTF-8 ({exc.reason}: {bad!r})"
        ) from None
    return text
