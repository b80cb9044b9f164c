"""Graph state: the conversation plus execution metadata. Subclass :class:`AgentState` to add fields.

State is persisted as JSON: ``messages`` go to the checkpointer's message log, every other field (including
``meta``) to the versioned thread state. Extra fields of a subclass must hold JSON values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, Self, TypeAlias

from tenxgraph.state.messages import JSON, Message
from tenxgraph.utils.errors import SerializationError

RunStatus: TypeAlias = Literal["idle", "running", "done", "error", "interrupted"]


@dataclass(slots=True)
class ExecutionMeta:
    """Where a thread's run stands. ``current_node`` is persisted *before* that node runs."""

    current_node: str | None = None
    step: int = 0
    status: RunStatus = "idle"
    error: str | None = None
    #: How often a server's recovery has resumed this interrupted thread (see ``tenxgraph.server.recovery``).
    recoveries: int = 0
    #: The pauses the current node asked for (``Interrupt.to_dict()``): kept until that node completes, so that
    #: their answers (in the ledger) are found again by every run that re-runs it. Status ``interrupted``: the run
    #: stopped to wait for them.
    interrupts: list[dict[str, JSON]] = field(default_factory=list)
    #: The limits the current run was started with (those its config said), and ``from_step``, the step it
    #: started at: a resume that says none of its own keeps them, and counts its nodes from that step.
    limits: dict[str, JSON] = field(default_factory=dict)

    def to_dict(self) -> dict[str, JSON]:
        out: dict[str, JSON] = {
            "current_node": self.current_node,
            "step": self.step,
            "status": self.status,
            "error": self.error,
        }
        if self.recoveries:
            out["recoveries"] = self.recoveries
        if self.interrupts:
            out["interrupts"] = list(self.interrupts)
        if self.limits:
            out["limits"] = dict(self.limits)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, JSON]) -> ExecutionMeta:
        return cls(
            current_node=data.get("current_node"),
            step=int(data.get("step", 0)),
            status=data.get("status", "idle"),
            error=data.get("error"),
            recoveries=int(data.get("recoveries") or 0),
            interrupts=list(data.get("interrupts") or []),
            limits=dict(data.get("limits") or {}),
        )


@dataclass
class AgentState:
    """Messages plus execution metadata. Subclasses add fields with defaults::

    @dataclass
    class SupportState(AgentState):
        refunded_total: float = 0.0
    """

    messages: list[Message] = field(default_factory=list)
    meta: ExecutionMeta = field(default_factory=ExecutionMeta)

    # -- views ------------------------------------------------------------------------------------------
    @property
    def last_message(self) -> Message | None:
        return self.messages[-1] if self.messages else None

    @property
    def last_assistant(self) -> Message | None:
        for message in reversed(self.messages):
            if message.role == "assistant":
                return message
        return None

    # -- persistence ------------------------------------------------------------------------------------
    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def values_dict(self) -> dict[str, JSON]:
        """Every field but ``messages`` as JSON values (what the thread state row stores)."""
        out: dict[str, JSON] = {}
        for f in dataclasses.fields(self):
            if f.name == "messages":
                continue
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if isinstance(value, ExecutionMeta) else value
        return out

    def to_dict(self) -> dict[str, JSON]:
        data = self.values_dict()
        data["messages"] = [m.to_dict() for m in self.messages]
        return data

    @classmethod
    def from_values(cls, values: dict[str, JSON], messages: list[Message]) -> Self:
        known = set(cls.field_names())
        unknown = set(values) - known
        if unknown:
            raise SerializationError(
                f"stored state has fields {sorted(unknown)} that {cls.__name__} does not declare; "
                f"compile the graph with the state class that wrote this thread"
            )
        kwargs: dict[str, Any] = {k: v for k, v in values.items() if k != "meta"}
        kwargs["meta"] = ExecutionMeta.from_dict(values.get("meta") or {})
        kwargs["messages"] = list(messages)
        return cls(**kwargs)

    @classmethod
    def from_dict(cls, data: dict[str, JSON]) -> Self:
        values = {k: v for k, v in data.items() if k != "messages"}
        return cls.from_values(values, [Message.from_dict(m) for m in data.get("messages", ())])
