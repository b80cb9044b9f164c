"""One tool call on its way through the ledger (:class:`LedgerCall`), what it produced (:class:`ToolExecution`), and
its ledger record: the format (versioned), encoding and decoding."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from tenxgraph.core.tools.context import ToolCallInfo
from tenxgraph.core.tools.tool import Tool, ToolOutput
from tenxgraph.state.messages import JSON, Message, ToolCallBlock, ToolResultBlock
from tenxgraph.utils.errors import SerializationError

RECORD_VERSION = 1
"""The format of records this runtime writes; a record of a newer format is refused on read, never misread."""


def result_message_id(key: str | None) -> str:
    """A tool result's message id: derived from the ledger key, so a replay yields the same message."""
    return f"tool_{uuid.uuid5(uuid.NAMESPACE_URL, key).hex}" if key else f"tool_{uuid.uuid4().hex}"


@dataclass(frozen=True, slots=True)
class LedgerCall:
    """One tool call, passed explicitly through the ledger's steps (check, invoke, record): the model's call as it
    sent it (``block``: call id, tool name, raw arguments), what the call knows of itself (``info``: thread,
    assistant message id, ledger key, index in its message, effect class, in-doubt policy, as a tool body sees
    it), the tool that runs it (None: the model named an unknown tool), and whether the ledger holds its intent
    without a result (``in_doubt``)."""

    block: ToolCallBlock
    info: ToolCallInfo
    tool: Tool | None
    in_doubt: bool = False
    #: How many ``interrupt()`` pauses of its body have been answered: each answered pause starts a new attempt.
    attempt: int = 0

    @property
    def key(self) -> str | None:
        """The ledger key (None: the model gave no ``tool_call_id``, and the call runs unprotected)."""
        return self.info.key

    @property
    def intent_key(self) -> str | None:
        """Where this attempt's intent is written: the ledger key for the first attempt; after a pause of the body
        was answered, a key of the attempt's own (the paused attempt's intent says nothing of this one)."""
        if self.key is None or self.attempt == 0:
            return self.key
        return f"{self.key}@{self.attempt}"

    @property
    def name(self) -> str:
        return self.block.name


@dataclass(frozen=True, slots=True)
class ToolExecution:
    """What one tool call produced, and how."""

    call: ToolCallBlock
    key: str | None
    result: ToolResultBlock
    update: dict[str, JSON] | None = None
    replayed: bool = False
    recorded: bool = False

    def message(self) -> Message:
        metadata: dict[str, JSON] = {"tool": self.call.name}
        if self.replayed:
            metadata["replayed"] = True
        return Message.tool(self.result, message_id=result_message_id(self.key), metadata=metadata)


@dataclass(frozen=True, slots=True)
class Decision:
    """What a helper of the ledger (in-doubt policies, a transactional call) tells it: run the tool when
    ``execution`` is None; else answer with ``execution``, which the ledger records first when ``record`` is set
    (so that the call never runs again). Helpers decide; only the ledger writes records."""

    execution: ToolExecution | None = None
    record: bool = False


def encode_record(execution: ToolExecution) -> dict[str, JSON]:
    return {
        "v": RECORD_VERSION,
        "kind": "value",
        "tool": execution.call.name,
        "call_id": execution.call.id,
        "output": execution.result.output,
        "is_error": execution.result.is_error,
        "status": execution.result.status,
        "update": execution.update,
    }


def decode_record(call: ToolCallBlock, key: str, record: Mapping[str, JSON]) -> ToolExecution:
    version = record.get("v", 1)
    if not isinstance(version, int) or version > RECORD_VERSION:
        raise SerializationError(
            f"ledger record {key!r} has format version {version!r}; this runtime reads versions up to "
            f"{RECORD_VERSION}: run a newer tenxgraph to resume this thread"
        )
    result = ToolResultBlock(
        call_id=call.id,
        output=record.get("output"),
        is_error=bool(record.get("is_error", False)),
        status=str(record.get("status", "success")),
    )
    return ToolExecution(call, key, result, update=record.get("update"), replayed=True, recorded=True)


def error_execution(call: ToolCallBlock, key: str | None, text: str, status: str = "error") -> ToolExecution:
    return ToolExecution(call, key, ToolResultBlock(call.id, text, is_error=True, status=status))


def execution_of(call: ToolCallBlock, key: str | None, value: object) -> ToolExecution:
    """What a tool (or a ``reconcile`` function) returned, as the call's execution: a :class:`ToolOutput`'s
    content, error flag and state update, or any other value as the output."""
    if isinstance(value, ToolOutput):
        result = ToolResultBlock(call.id, value.content, value.is_error, "error" if value.is_error else "success")
        return ToolExecution(call, key, result, update=value.update)
    return ToolExecution(call, key, ToolResultBlock(call.id, value))
