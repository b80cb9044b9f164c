"""Pauses for a person: a tool call that waits for approval (``@tool(approval=...)``) and ``interrupt(payload)`` in
a node or a tool body. What a run that paused lists (:class:`Interrupt`), what answers it (:class:`Resume`), and how
an answer is keyed and recorded.

A pause is durable: the run stores its interrupts in the thread's state (status ``interrupted``) and stops. An
answer (a *decision*) is recorded in the thread's ledger under :func:`decision_key` before anything acts on it, with
the ledger's first-write-wins rule: one decision per interrupt, ever. An interrupt's id is derived from what it is
about (an approval from the call's ledger key *and* its arguments, an ``interrupt()`` from its call or node and its
place there), so the same pause gets the same id in every process, and an approval never applies to other
arguments.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tenxgraph.state.messages import JSON
from tenxgraph.utils.errors import ConfigError

#: An interrupt that asks whether a tool call may run (``@tool(approval=...)``).
APPROVAL = "approval"
#: An interrupt raised by ``interrupt(payload)``: any question, answered with any JSON value.
QUESTION = "interrupt"
#: A rejected call's result status (its error result is recorded: it never runs).
REJECTED = "rejected"
#: What ``@tool(approval=...)`` takes: always, never, or a predicate on the call's arguments.
ApprovalRule = bool | Callable[[dict[str, JSON]], bool]


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:24]


def canonical_args(args: object) -> str:
    """The arguments as one JSON text (sorted keys): what an approval's id covers."""
    return json.dumps(args, sort_keys=True, separators=(",", ":"), default=repr)


def approval_id(execution_id: str, args: object) -> str:
    """The id of the approval of the call *execution_id* (its ledger key) with exactly these arguments."""
    return f"approval-{_digest('approval', execution_id, canonical_args(args))}"


def call_interrupt_id(execution_id: str, index: int) -> str:
    """The id of the *index*-th ``interrupt()`` of the body of the call *execution_id*."""
    return f"interrupt-{_digest('call', execution_id, str(index))}"


def node_interrupt_id(node: str, step: int, index: int) -> str:
    """The id of the *index*-th ``interrupt()`` of node *node* at step *step* (the same on every re-run of it)."""
    return f"interrupt-{_digest('node', node, str(step), str(index))}"


def decision_key(interrupt_id: str) -> str:
    """Where the decision for *interrupt_id* is recorded in the thread's ledger."""
    return f"decision:{interrupt_id}"


@dataclass(frozen=True, slots=True)
class Interrupt:
    """One pause a run is waiting on. ``kind`` is ``"approval"`` (a tool call waits for a yes or no: ``tool``,
    ``args``, ``message_id``, ``call_id`` say which) or ``"interrupt"`` (``interrupt(payload)``: ``value`` is the
    payload; ``node`` and, in a tool body, ``tool``/``call_id`` say where)."""

    id: str
    kind: str
    value: JSON = None
    tool: str | None = None
    args: JSON = None
    message_id: str | None = None
    call_id: str | None = None
    node: str | None = None

    def to_dict(self) -> dict[str, JSON]:
        out: dict[str, JSON] = {"id": self.id, "kind": self.kind, "value": self.value}
        for name in ("tool", "args", "message_id", "call_id", "node"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Interrupt:
        return cls(
            id=str(data["id"]),
            kind=str(data.get("kind", QUESTION)),
            value=data.get("value"),
            tool=data.get("tool"),
            args=data.get("args"),
            message_id=data.get("message_id"),
            call_id=data.get("call_id"),
            node=data.get("node"),
        )


_ONE = object()  # Resume(value=...) not given


class Resume:
    """The input that answers a paused thread: ``app.invoke(Resume({interrupt_id: value}), {"thread_id": ...})``.

    For an approval, ``True`` approves, ``False`` rejects, and a string rejects with that reason (the model is
    told it). For ``interrupt(payload)``, any JSON value: what ``interrupt`` returns when the run goes on. Pending
    interrupts may be answered one by one or together; the run goes on when every one is answered.

    ``Resume(value=...)`` answers the one interrupt a thread waits for (a thread that waits for several, or for
    none, refuses it). By id is what a retried request should send: it is answered idempotently even once the
    thread has gone on, where ``value=`` finds nothing left to answer."""

    __slots__ = ("decisions", "value")

    def __init__(self, decisions: Mapping[str, JSON] | None = None, *, value: Any = _ONE) -> None:
        self.value: Any = value
        if value is not _ONE:
            if decisions is not None:
                raise ConfigError("Resume takes decisions by id or value= for the one pending interrupt, not both")
            _check_json("value", value)
            self.decisions: dict[str, JSON] = {}
            return
        if not isinstance(decisions, Mapping) or not decisions:
            raise ConfigError(
                f"Resume takes a non-empty dict of interrupt id -> decision, got {decisions!r}; the ids are in "
                "result.interrupts (or GET /threads/{id}/state)"
            )
        for key, decision in decisions.items():
            if not isinstance(key, str) or not key:
                raise ConfigError(f"Resume: interrupt ids are strings from result.interrupts, got {key!r}")
            _check_json(repr(key), decision)
        self.decisions = dict(decisions)

    def resolve(self, pending: list[Interrupt], thread_id: str) -> dict[str, JSON]:
        """The decisions by id: as given, or ``value=`` for the one interrupt *pending*."""
        if self.value is _ONE:
            return self.decisions
        if len(pending) != 1:
            ids = [i.id for i in pending]
            raise ConfigError(
                f"Resume(value=...) answers the one interrupt a thread waits for; thread {thread_id!r} waits for "
                f"{len(pending)} ({ids}): answer by id, Resume({{id: value}})"
            )
        return {pending[0].id: self.value}

    def __repr__(self) -> str:
        return f"Resume({self.decisions!r})" if self.value is _ONE else f"Resume(value={self.value!r})"


def _check_json(what: str, value: object) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"Resume: the decision for {what} must be a JSON value ({exc})") from None


def check_approval_value(interrupt_id: str, value: JSON) -> None:
    """An approval's decision is True (approve), False or a reason (reject): a clear error for anything else."""
    if not isinstance(value, bool | str):
        raise ConfigError(
            f"Resume: approval {interrupt_id!r} takes True (approve), False or a reason string (reject), got {value!r}"
        )


def is_approved(value: JSON) -> bool:
    return value is True


def rejection_text(tool: str, value: JSON) -> str:
    """What the model is told of a rejected call (its recorded error result)."""
    reason = f": {value}" if isinstance(value, str) and value else ""
    return f"the call to {tool!r} was rejected by a person and did not run{reason}"


class GraphInterrupt(Exception):
    """Raised by ``interrupt()`` and by a call awaiting approval: the run loop turns it into a pause (status
    ``interrupted``). Let it pass: a tool or node that catches it (``except Exception``) is told so by the run."""

    def __init__(self, interrupts: list[Interrupt]) -> None:
        self.interrupts = interrupts
        ids = ", ".join(i.id for i in interrupts)
        super().__init__(f"the run paused for {len(interrupts)} interrupt(s): {ids}; answer with Resume")


@dataclass
class Pauses:
    """A run's answers to interrupts (id -> decision, read from the ledger before the run goes on) and how many
    ``interrupt()`` calls each node or call has made in this attempt (their place is part of their id)."""

    decisions: dict[str, JSON] = field(default_factory=dict)
    step: int = 0
    #: The node running (an approval names it in its interrupt).
    node: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    #: Interrupts raised in this run that a tool or node caught and did not let pass (the run pauses anyway).
    raised: list[Interrupt] = field(default_factory=list)

    def next_index(self, where: str) -> int:
        index = self.counts.get(where, 0)
        self.counts[where] = index + 1
        return index

    def ask(self, interrupt: Interrupt) -> JSON:
        """The decision for *interrupt*, or :class:`GraphInterrupt` (remembered, so that swallowing it is seen)."""
        if interrupt.id in self.decisions:
            return self.decisions[interrupt.id]
        self.raised.append(interrupt)
        raise GraphInterrupt([interrupt])
