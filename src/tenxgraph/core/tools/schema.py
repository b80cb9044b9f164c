"""JSON schemas for tools: a type hint's schema, a Google-style docstring's parts, and a value checked against a
schema (the checks a model's arguments get before a tool runs)."""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable
from typing import Any, Literal, Union, get_args, get_origin

from tenxgraph.state.messages import JSON

_PRIMITIVES: dict[Any, dict[str, JSON]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    dict: {"type": "object"},
    list: {"type": "array"},
    Any: {},
}


def json_schema_for(hint: Any) -> dict[str, JSON]:
    """The JSON schema of a type hint (str, int, float, bool, None, list[X], dict[str, X], Literal, X | Y)."""
    if hint in _PRIMITIVES:
        return dict(_PRIMITIVES[hint])
    origin = get_origin(hint)
    args = get_args(hint)
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (Union, types.UnionType):
        options = [json_schema_for(a) for a in args]
        return options[0] if len(options) == 1 else {"anyOf": options}
    if origin in (list, tuple, set, frozenset):
        return {"type": "array", "items": json_schema_for(args[0])} if args else {"type": "array"}
    if origin is dict:
        out: dict[str, JSON] = {"type": "object"}
        if len(args) == 2:
            out["additionalProperties"] = json_schema_for(args[1])
        return out
    raise TypeError(f"type hint {hint!r} has no JSON schema; use str, int, float, bool, list, dict or Literal")


def docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """The description and the per-argument docs of a Google-style docstring."""
    doc = inspect.cleandoc(doc)
    summary, _, rest = doc.partition("\nArgs:\n")
    params: dict[str, str] = {}
    current: str | None = None
    for line in rest.splitlines():
        if re.match(r"^\S", line):  # next section (Returns:, Raises:)
            break
        match = re.match(r"^\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
        if match:
            current = match.group(1)
            params[current] = match.group(2).strip()
        elif current and line.strip():
            params[current] += " " + line.strip()
    return summary.strip(), params


_CHECKS: dict[str, Callable[[JSON], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}


def matches(value: JSON, schema: JSON) -> bool:
    """Whether *value* fits *schema*, for the schemas our own tools generate (types, ``anyOf``, ``enum``,
    ``items``). Total: any other schema (``true``/``false``, a list of types, tuple-form ``items``, keywords it
    does not know) is judged by what it understands and never raises. A server's schemas are validated with a
    JSON Schema library instead (see the MCP integration)."""
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict):
        return True
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options and not any(matches(value, s) for s in options):
            return False
    if isinstance(schema.get("enum"), list) and value not in schema["enum"]:
        return False
    kind = schema.get("type")
    kinds = [k for k in (kind if isinstance(kind, list) else [kind]) if isinstance(k, str) and k in _CHECKS]
    if kinds and not any(_CHECKS[k](value) for k in kinds):
        return False
    items = schema.get("items")
    if isinstance(value, list) and isinstance(items, dict | bool):
        return all(matches(v, items) for v in value)
    if isinstance(value, list) and isinstance(items, list):  # tuple form: one schema per position
        return all(matches(v, s) for v, s in zip(value, items, strict=False))
    return True
