"""What a node or a tool body may know about the run it executes in: the run's context (:func:`current_run`) and,
inside a tool body, the tool call being executed (:func:`current_tool_call`, or a parameter typed
:data:`ToolContext`).

This module holds the runtime's only ContextVar: one :class:`Scope` per running node or tool call. Everything else
(the checkpointer, the thread, the call) is passed explicitly; the scope exists so that user code (a node, a tool
body) can ask where it runs without every signature carrying it."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tenxgraph.core.tools.config import RunConfig
from tenxgraph.core.tools.interrupts import QUESTION, Interrupt, Pauses, call_interrupt_id, node_interrupt_id
from tenxgraph.core.tools.observe import RunObserver
from tenxgraph.state.messages import JSON
from tenxgraph.storage.checkpointer.base import BaseCheckpointer


@dataclass(frozen=True, slots=True)
class RunContext:
    config: RunConfig
    checkpointer: BaseCheckpointer
    node: str
    #: This node is the one a crashed or failed run left unfinished, run again by a resume.
    resumed: bool = False
    #: The run's answers to interrupts, and the places of this attempt's ``interrupt()`` calls.
    pauses: Pauses = field(default_factory=Pauses)
    #: The run's stream and tracer: a model node streams its tokens to it (see :func:`tenxgraph.models.generate`).
    observer: RunObserver | None = None

    @property
    def thread_id(self) -> str:
        return self.config.thread_id


@dataclass(frozen=True, slots=True)
class ToolCallInfo:
    """The tool call being executed: what a tool body (or an observer) may know about itself."""

    thread_id: str
    message_id: str
    call_id: str | None
    tool: str
    index: int
    key: str | None
    #: The tool's in-doubt policy ("retry", "fail", "reconcile"), None when it did not opt in.
    on_in_doubt: str | None = None
    #: The tool's effect class ("read", "idempotent", "external", "transactional"), None when it says none.
    effect: str | None = None

    @property
    def idempotency_key(self) -> str:
        """A key for external APIs: the same on every replay and in every process, different for every other call.

        Derived from (thread_id, assistant message id, tool_call_id); pass it to payment or email providers.
        """
        digest = hashlib.sha256(f"{self.thread_id}\x00{self.execution_id}".encode()).hexdigest()
        return f"tenx-{digest[:40]}"

    @property
    def execution_id(self) -> str:
        """The ledger key, or (unprotected call) a stand-in that is still stable across replays of the message."""
        return self.key or f"unkeyed:{self.message_id}:{self.index}:{self.tool}"


ToolContext = ToolCallInfo
"""Declare a parameter of this type in a tool to receive the call's context (never shown to the model)."""


@dataclass(frozen=True, slots=True)
class Transaction:
    """The open transaction a transactional tool's body writes through, when the tool cannot take it as a
    parameter (a framework's tool, such as LangGraph's): the ledger's *connection* (``sqlite3.Connection``, or
    ``psycopg.AsyncConnection`` running on *loop*). *ended*: set when the body's scope is left (the body
    returned, raised, or was cancelled): a statement sent through a view of it after that is refused, not run
    outside the transaction; *running*: how many such statements run now (their transaction waits for them:
    :func:`tenxgraph.core.tools.transaction_views.statements_done`); *guard*: the lock around both."""

    connection: Any
    loop: asyncio.AbstractEventLoop | None = None
    ended: threading.Event = field(default_factory=threading.Event, compare=False)
    running: list[int] = field(default_factory=lambda: [0], compare=False)
    guard: threading.Lock = field(default_factory=threading.Lock, compare=False)


@dataclass(frozen=True, slots=True)
class Scope:
    """Where the code running in this context is: a node of a run, and maybe one of its tool calls."""

    run: RunContext | None = None
    call: ToolCallInfo | None = None
    transaction: Transaction | None = None


_scope: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("tenxgraph_scope", default=None)


def current_run() -> RunContext | None:
    """The run context of the node being executed, or None outside a run."""
    scope = _scope.get()
    return scope.run if scope is not None else None


def current_tool_call() -> ToolCallInfo | None:
    """Inside a tool body: the call being executed (thread, message id, tool_call_id, ledger key)."""
    scope = _scope.get()
    return scope.call if scope is not None else None


def current_idempotency_key() -> str | None:
    """The idempotency key of the tool call running now through the ledger: the same on every replay and in every
    process, different for every other call; pass it to the payment or email provider. None outside a protected
    call (a call no ledger guards, or one without ids)."""
    call = current_tool_call()
    return call.idempotency_key if call is not None and call.key is not None else None


@contextlib.contextmanager
def running_node(ctx: RunContext) -> Iterator[None]:
    """The scope of one node's execution (set by the run loop)."""
    token = _scope.set(Scope(ctx))
    try:
        yield
    finally:
        _scope.reset(token)


@contextlib.contextmanager
def running_call(info: ToolCallInfo) -> Iterator[None]:
    """The scope of one tool call's execution (set by the ledger), inside the node's scope if there is one."""
    token = _scope.set(Scope(current_run(), info))
    try:
        yield
    finally:
        _scope.reset(token)


@contextlib.contextmanager
def in_transaction(transaction: Transaction) -> Iterator[None]:
    """The scope of a transactional tool's body that reaches its transaction through :func:`current_transaction`
    (set by an integration around the framework's own call of the tool)."""
    scope = _scope.get() or Scope()
    token = _scope.set(Scope(scope.run, scope.call, transaction))
    try:
        yield
    finally:
        with transaction.guard:  # (before the transaction is left: a thread of the body's still running is refused)
            transaction.ended.set()
        _scope.reset(token)


def current_transaction() -> Transaction | None:
    """Inside a transactional tool's body run by an integration: its transaction (else None)."""
    scope = _scope.get()
    return scope.transaction if scope is not None else None


def interrupt(value: JSON = None) -> JSON:
    """Pause the run until a person answers: in a node or a tool body, ``answer = interrupt({"question": ...})``.

    The first time, the run stops (status ``interrupted``; ``result.interrupts`` lists this one with *value*) and
    the thread waits, durably, across restarts. ``app.invoke(Resume({id: answer}), config)`` records the answer
    and runs the node (or tool call) again from its start: this time ``interrupt`` returns the answer. Code before
    it runs again, so put effects after it (or in tools, which the ledger protects). A node may pause several
    times: each ``interrupt()`` is told apart by its place in the node (keep their order stable)."""
    scope = _scope.get()
    if scope is None or scope.run is None:
        raise RuntimeError("interrupt() pauses a run: call it inside a node or a tool of a compiled graph")
    run, call, pauses = scope.run, scope.call, scope.run.pauses
    if call is not None:
        index = pauses.next_index(call.execution_id)
        asked = Interrupt(
            call_interrupt_id(call.execution_id, index),
            QUESTION,
            value,
            tool=call.tool,
            message_id=call.message_id,
            call_id=call.call_id,
            node=run.node,
        )
    else:
        index = pauses.next_index(f"node:{run.node}:{pauses.step}")
        asked = Interrupt(node_interrupt_id(run.node, pauses.step, index), QUESTION, value, node=run.node)
    return pauses.ask(asked)
