"""What a client may send and ask for: the body cap and read timeout, the run body's fields, and the operator's
ceilings on a run's limits, which a request may lower but never raise (nor turn off)."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, fields
from typing import Any

from tenxgraph.core.tools.interrupts import Resume
from tenxgraph.server.doors import Refused
from tenxgraph.state.messages import Message, TextBlock, new_id
from tenxgraph.utils.constants import NODE_TIMEOUT, RECURSION_LIMIT, TOOL_TIMEOUT
from tenxgraph.utils.errors import ConfigError

RUN_FIELDS = ("messages", "config", "resume")
#: What a client's ``config`` may say: the run's limits, each within the operator's ceiling (a tracer, the thread
#: id and anything else are the server's to choose).
CLIENT_CONFIG_KEYS = ("recursion_limit", "tool_timeout", "node_timeout", "lock_timeout")
#: The least a client may ask for (seconds): below it a body's effect lands while the thread records a timeout.
MIN_TIMEOUT = 0.1
MESSAGE_FIELDS = ("role", "text", "message_id")


class BadRequest(Refused):
    """A request body or config the server cannot use: a :class:`Refused` with status 422 unless said."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(status, message)


@dataclass(frozen=True, slots=True)
class Limits:
    """The operator's ceilings (``tenxgraph serve --max-...``, ``create_app(limits=Limits(...))``).

    A request's ``config`` may ask for less, never for more, and may not disable a limit (``0``/``None``); a
    request that does not say gets the ceiling for the timeouts and the runtime's default recursion limit."""

    max_body_bytes: int = 1024 * 1024  # a larger body is 413, refused before it is read whole
    body_timeout: float = 30.0  # seconds to receive the whole body, or 408
    recursion_limit: int = RECURSION_LIMIT
    tool_timeout: float = TOOL_TIMEOUT
    node_timeout: float = NODE_TIMEOUT
    lock_timeout: float = 30.0
    #: ``GET /state`` sends a thread's messages a page at a time: at most this many bytes of them (one at least).
    max_state_page_bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 or math.isinf(value):
                raise ValueError(f"Limits.{f.name} must be a finite number > 0, got {value!r}")

    def run_config(self, asked: Mapping[str, Any], lock_timeout: float) -> dict[str, Any]:
        """The run config for a request's ``config``: its values where they are within the ceilings."""
        config: dict[str, Any] = {
            "recursion_limit": self.recursion_limit,
            "tool_timeout": self.tool_timeout,
            "node_timeout": self.node_timeout,
            "lock_timeout": min(lock_timeout, self.lock_timeout),
        }
        for key, value in asked.items():
            if key not in CLIENT_CONFIG_KEYS:
                raise BadRequest(f"config.{key} is not a client's to set; a run's config may say {CLIENT_CONFIG_KEYS}")
            ceiling = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
                raise BadRequest(f"config.{key} must be a number, got {value!r}")
            if key == "recursion_limit" and not float(value).is_integer():
                raise BadRequest(f"config.recursion_limit must be a whole number of nodes, got {value!r}")
            if key in ("tool_timeout", "node_timeout") and 0 < value < MIN_TIMEOUT:
                raise BadRequest(
                    f"config.{key}={value!r} is below this server's floor of {MIN_TIMEOUT} s: a timeout shorter "
                    "than a body can return records a timeout while its effect lands"
                )
            if (value <= 0 and key != "lock_timeout") or value < 0:
                raise BadRequest(
                    f"config.{key} must be > 0: a client cannot turn the server's limit off (ceiling {ceiling})"
                )
            if value > ceiling:
                flag = "--max-" + key.replace("_", "-")
                raise BadRequest(
                    f"config.{key}={value!r} is above this server's ceiling of {ceiling}: ask for less, or have "
                    f"the operator raise it (tenxgraph serve {flag}, create_app(limits=Limits({key}=...)))"
                )
            config[key] = int(value) if key == "recursion_limit" else value
        return config


async def read_body(request: Any, limits: Limits) -> bytes:
    """The body, read in chunks: over ``max_body_bytes`` is 413 as soon as it is known (its Content-Length, or
    the chunk that passes the cap), so a huge body never sits in memory; slower than ``body_timeout`` is 408."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limits.max_body_bytes:
        raise BadRequest(too_large(int(length), limits), status=413)
    chunks: list[bytes] = []
    size = 0

    async def receive(stream: AsyncIterator[bytes]) -> None:
        nonlocal size
        async for chunk in stream:
            size += len(chunk)
            if size > limits.max_body_bytes:
                raise BadRequest(too_large(size, limits), status=413)
            chunks.append(chunk)

    try:
        await asyncio.wait_for(receive(request.stream()), limits.body_timeout)
    except TimeoutError:
        raise BadRequest(
            f"the body did not arrive within {limits.body_timeout:g} s (tenxgraph serve --body-timeout)", 408
        ) from None
    return b"".join(chunks)


def too_large(size: int, limits: Limits) -> str:
    return (
        f"the body is {size} bytes or more; this server takes at most {limits.max_body_bytes} "
        "(tenxgraph serve --max-body-bytes)"
    )


def _message(data: Any, index: int, allow_system: bool) -> Message:
    if not isinstance(data, dict):
        raise BadRequest(f"messages[{index}] must be an object with role and text")
    unknown = sorted(set(data) - set(MESSAGE_FIELDS))
    if unknown:
        raise BadRequest(f"messages[{index}] has unknown fields {unknown}; allowed: {list(MESSAGE_FIELDS)}")
    role, text = data.get("role", "user"), data.get("text")
    if role not in ("user", "system"):
        raise BadRequest(f"messages[{index}].role must be 'user' or 'system', got {role!r}")
    if role == "system" and not allow_system:
        raise BadRequest(
            f"messages[{index}]: this server does not take system messages from clients (they would instruct the "
            "agent); the operator can allow them: tenxgraph serve --allow-system-messages",
            status=403,
        )
    if not isinstance(text, str):
        raise BadRequest(f"messages[{index}].text must be a string")
    message_id = data.get("message_id") or new_id()
    if not isinstance(message_id, str):
        raise BadRequest(f"messages[{index}].message_id must be a string")
    return Message(role=role, content=(TextBlock(text),), message_id=message_id)


def parse_run(raw: bytes, allow_system: bool) -> tuple[dict[str, Any] | Resume | None, dict[str, Any]]:
    """``(input, config)`` of a run request's JSON body (both optional: no messages resumes the thread; ``resume``,
    an object of interrupt id -> decision, answers a paused one)."""
    try:
        body = json.loads(raw, object_pairs_hook=_unique_keys) if raw.strip() else {}
    except json.JSONDecodeError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("the body is nested too deeply to be a run request") from None
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the body is not UTF-8: {exc.reason}") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object with optional fields messages, config and resume")
    unknown = sorted(set(body) - set(RUN_FIELDS))
    if unknown:
        raise BadRequest(f"unknown fields {unknown}; allowed: {list(RUN_FIELDS)}")
    messages = body.get("messages") or []
    if not isinstance(messages, list):
        raise BadRequest("messages must be a list")
    config = body.get("config") or {}
    if not isinstance(config, dict):
        raise BadRequest(f"config must be an object with keys from {list(CLIENT_CONFIG_KEYS)}")
    if foreign := sorted(set(config) - set(CLIENT_CONFIG_KEYS)):
        raise BadRequest(
            f"config {foreign} is not a client's to set (the server chooses it); a run's config may say "
            f"{list(CLIENT_CONFIG_KEYS)}"
        )
    if body.get("resume") is not None:
        if messages:
            raise BadRequest("send messages or resume, not both: answer the thread's interrupts first")
        try:
            return Resume(body["resume"]), config
        except ConfigError as exc:
            raise BadRequest(str(exc)) from None
    parsed = [_message(m, i, allow_system) for i, m in enumerate(messages)]
    return ({"messages": parsed} if parsed else None), config


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different: a duplicate (``{"i": false, "i": true}``, where the last would
    win) is refused, naming it."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise BadRequest(f"the body says {key!r} twice in one object: say each key once")
        seen[key] = value
    return seen


#: The most messages one ``GET /state`` page holds (``messages_limit``, its default too).
MAX_PAGE_MESSAGES = 1000


def page_of(query: Mapping[str, str]) -> tuple[int, int]:
    """``(messages_from, messages_limit)`` of a ``GET /state`` query (422 naming a bad one)."""
    values = []
    for name, default, least in (("messages_from", 0, 0), ("messages_limit", MAX_PAGE_MESSAGES, 1)):
        raw = query.get(name, str(default))
        if not raw.isdigit() or not least <= int(raw) <= (MAX_PAGE_MESSAGES if least else 10**12):
            most = MAX_PAGE_MESSAGES if least else "the thread's message count"
            raise BadRequest(f"{name} must be a whole number from {least} to {most}, got {raw!r}")
        values.append(int(raw))
    return values[0], values[1]


def message_page(messages: list[dict[str, Any]], first: int, limit: int, max_bytes: int) -> tuple[int, int | None]:
    """How many of *messages* (as JSON objects) from *first* one page holds (at most *limit*, at most *max_bytes*
    of JSON, one at least), and where the next page starts (None: this is the last)."""
    size, taken = 0, 0
    for message in messages[first : first + limit]:
        size += len(json.dumps(message, default=str))
        if taken and size > max_bytes:
            break
        taken += 1
    end = first + taken
    return taken, (end if end < len(messages) else None)
