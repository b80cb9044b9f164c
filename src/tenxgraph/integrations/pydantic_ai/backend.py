"""Where Pydantic AI's durable operations meet the ledger: :class:`LedgerBackend`, the engine's backend
(``pydantic_ai.durable_exec.JournalCallableOperationBackend``), given each operation as one async body.

The ledger's thread is the conversation (Pydantic AI's ``conversation_id``, which a run inherits from the
message history it continues, and which :class:`~.durability.LedgerDurability` derives from the ``run_id`` for a
run that starts one): every run of a conversation, a resume or the answer to a deferred call, keys a call alike.

- A **model request** is journaled in the ledger's store, in the conversation's thread, under
  ``model-response:{run_id}:{s}:{n}`` (*s*: the run's step, Pydantic AI's ``run_step``; *n*: how many messages the
  request carries; the same on every replay of the run). Recorded: the response is answered from the record and
  the model is not asked. First write wins: two processes resuming one run go on with the response recorded
  first. The record keeps a digest of the run's user prompt: a resume that gives another is refused
  (``ConfigError``), not answered with the first prompt's turns.
- A **tool call** (function and MCP toolsets) goes through the ledger's public entry
  (:func:`tenxgraph.ledger.invoke_tool_call`), keyed by the response that asked for it (``response:{p}``, its
  place in the conversation's history) and the call's ``tool_call_id``. The tool's encoded result (Pydantic AI's
  ``CallToolResult``: a return value, or a ``ModelRetry`` / ``ToolFailed`` carried as data) is what is recorded
  and replayed. A tool that raised is recorded as failed: the run that ran it gets its exception, a resumed run
  tells the model it failed (``ToolFailed``), and it never runs again. A call a person approved (Pydantic AI's
  deferred tools) is a call like any: the first run given the approval runs it, every other replays it. A body
  that pauses (it raises ``ApprovalRequired`` until approved, or ``CallDeferred``) is not recorded: the approved
  run runs it again, as a new attempt with an intent of its own (Pydantic AI's ``tool_call_approved``).
- Anything else (argument validation, event handlers, token counts) runs as it is, not journaled: it has no
  effect outside the process.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.durable_exec import (
    DurableOperationId,
    JournalCallableOperationBackend,
    ModelRequestId,
    ToolsetCallToolId,
    ToolsetCallToolParams,
)
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart

from tenxgraph.core.tools.interrupts import APPROVAL, QUESTION
from tenxgraph.ledger import (
    TX_PARAM,
    CallGroups,
    Effect,
    GraphInterrupt,
    Interrupt,
    LedgerStore,
    Reconcile,
    Tool,
    ToolExecution,
    ToolOutput,
    Transaction,
    in_transaction,
    invoke_tool_call,
    probe,
    statements_done,
)
from tenxgraph.state.messages import JSON, Message, ToolCallBlock
from tenxgraph.utils.constants import LOGGER_NAME
from tenxgraph.utils.errors import ConfigError
from tenxgraph.utils.sync import sync_loop

__all__ = [
    "LedgerBackend",
    "ToolPolicy",
    "conversation_of",
    "model_key",
    "response_id",
    "run_id_of",
    "thread_of",
]
log = logging.getLogger(LOGGER_NAME)

Body = Callable[[], Awaitable[object]]
#: The kinds of Pydantic AI's encoded tool results that are its pauses, not results (``ApprovalRequired``,
#: ``CallDeferred`` raised in a tool's body).
PAUSES = ("approval_required", "call_deferred")


class PausedInTransaction(BaseException):
    """A transactional tool's body paused (``ApprovalRequired``, ``CallDeferred``): its transaction rolls back,
    writes and all, and the pause (Pydantic AI's encoded result, *payload*) goes back to Pydantic AI unrecorded.
    A ``BaseException``: the ledger records what an ``Exception`` says, and this is no result of the call."""

    def __init__(self, payload: object) -> None:
        super().__init__("a transactional tool's body paused")
        self.payload = payload


@dataclass(frozen=True)
class ToolPolicy:
    """What was declared for a tool, checked: its in-doubt policy, reconcile function and effect class."""

    on_in_doubt: str | None
    reconcile: Reconcile | None
    effect: Effect | None


def thread_of(agent_name: str, conversation_id: str) -> str:
    """The ledger thread of a conversation of the agent named *agent_name*."""
    return f"pydantic-ai:{agent_name}:{conversation_id}"


def model_key(run_id: str, run_step: int, messages: Sequence[ModelMessage]) -> str:
    """The journal key of the model request run *run_id* makes at *run_step*, carrying *messages*."""
    return f"model-response:{run_id}:{run_step}:{len(messages)}"


def response_id(position: int) -> str:
    """The ledger's message id of the response at *position* in a run's history (the same on every replay)."""
    return f"response:{position}"


class LedgerBackend(JournalCallableOperationBackend[None]):
    """The engine's backend: model requests journaled, tool calls through the ledger (*policy_of*: a tool's
    checked declarations, by its name and metadata)."""

    def __init__(
        self,
        *,
        agent_name: str,
        ledger: LedgerStore,
        tool_timeout: float | None,
        policy_of: Callable[[str, Mapping[str, Any]], ToolPolicy],
        groups: CallGroups,
        config: Any,
    ) -> None:
        super().__init__(agent_name=agent_name, config=config)
        self.agent_name = agent_name
        self.ledger = ledger
        self.tool_timeout = tool_timeout
        self.policy_of = policy_of
        self.groups = groups
        #: Each run's latest model response (by ``run_id``): a streamed run that ends on it runs its calls before
        #: it joins the run's history (see :func:`_asking`).
        self.latest: dict[str, ModelResponse] = {}
        #: The calls each step of a run runs (by ``run_id`` and step; see :meth:`LedgerDurability.after_tool_validate`):
        #: validated all before any runs, without the siblings it skips, defers or denies. None: one runs alone.
        self.coming: dict[tuple[str, int], list[str] | None] = {}

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Body,
        cache_key: tuple[object, ...],
        config: None,
    ) -> object:
        if isinstance(operation_id, ModelRequestId):
            messages, context = cache_key[1], cache_key[-1]
            assert isinstance(messages, list) and isinstance(context, RunContext)
            return await self._journaled(body, context, model_key(run_id_of(context), context.run_step, messages))
        if isinstance(operation_id, ToolsetCallToolId):
            tool_name, args, context, tool = cache_key[0], cache_key[1], cache_key[2], cache_key[3]
            assert isinstance(tool_name, str) and isinstance(args, dict) and isinstance(context, RunContext)
            params = ToolsetCallToolParams(tool_name, tool_args=args, ctx=context, tool=tool)  # type: ignore[arg-type]
            return await self._tool_call(body, params)
        return await body()

    # -- model requests --------------------------------------------------------------------------------------
    async def _journaled(self, body: Body, context: RunContext[Any], key: str) -> object:
        thread = thread_of(self.agent_name, conversation_of(context))
        prompt = prompt_fingerprint(context.prompt)
        found = (await self.ledger.aget_tool_results(thread, [key])).get(key)
        if found is not None:
            return _same_prompt(found, prompt, context)["payload"]
        payload = await body()
        probe.point("pydantic_ai.after_model_response")
        record: dict[str, JSON] = {"v": 1, "kind": "model_response", "payload": payload, "prompt": prompt}
        if await self.ledger.aput_tool_result(thread, key, record):
            probe.point("pydantic_ai.after_model_record")
            return payload
        winner = (await self.ledger.aget_tool_results(thread, [key]))[key]  # (another resumer recorded first)
        return _same_prompt(winner, prompt, context)["payload"]

    # -- tool calls ------------------------------------------------------------------------------------------
    async def _tool_call(self, body: Body, params: ToolsetCallToolParams) -> object:
        context = params.ctx
        thread = thread_of(self.agent_name, conversation_of(context))
        found = _asking(context.messages, context.tool_call_id, self.latest.get(run_id_of(context)))
        if found is None:
            log.warning(
                "tool call %r (%r) of run %r runs without replay protection: no response in the run's history "
                "asked for it (a tool called outside the agent's loop?)",
                params.name, context.tool_call_id, context.run_id,
            )  # fmt: skip
            return await body()
        response, position, index = found
        message = _as_message(response, position)
        metadata = (getattr(getattr(params.tool, "tool_def", None), "metadata", None) or {}) if params.tool else {}
        policy = self.policy_of(params.name, metadata)
        raised: list[Exception] = []
        paused: list[object] = []
        transactions = getattr(self.ledger, "transactions", None)
        tool = _ledger_tool(params.name, params.tool_args, body, policy, (raised, paused), transactions)
        coming = self.coming.get((run_id_of(context), context.run_step), [])
        group = self.groups.join(self.ledger, thread, message, response, coming=coming or ())
        attempt = 1 if context.tool_call_approved else 0  # (approved: the attempt after its pause, its own intent)
        tools, timeout = {tool.name: tool}, self.tool_timeout
        try:
            execution = await invoke_tool_call(message, index, tools, self.ledger, thread, tool_timeout=timeout,
                                               group=group, attempt=attempt)  # fmt: skip
        except GraphInterrupt:
            if paused:  # the body paused (ApprovalRequired, CallDeferred): Pydantic AI's own pause, unrecorded
                return paused[-1]
            raise
        except PausedInTransaction as pause:  # (its transaction rolled back: nothing of it stays)
            return pause.payload
        finally:
            self.groups.passed(group)
        return await _payload(execution, raised)


def prompt_fingerprint(prompt: object) -> str | None:
    """What a run's journal keeps of its user prompt (a digest; None: the run was given none, as a run that
    answers deferred calls on a message history is)."""
    if prompt is None:
        return None
    text = prompt if isinstance(prompt, str) else repr(prompt)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _same_prompt(record: dict[str, Any], prompt: str | None, context: RunContext[Any]) -> dict[str, Any]:
    """A journaled turn, answered only to the run it was recorded for: a resume that gives another prompt than
    the run was started with would get the first prompt's turns."""
    if "prompt" in record and record["prompt"] != prompt:  # (one journaled without it: taken)
        raise ConfigError(
            f"Pydantic AI run {context.run_id!r} was started with another user prompt than this one "
            f"({context.prompt!r}), and its journal holds that run's model turns: resume a run with the prompt "
            "it was started with, or start a new run with another run_id"
        )
    return record


def run_id_of(context: RunContext[Any]) -> str:
    if not context.run_id:
        raise RuntimeError("a durable Pydantic AI run has no run_id: Pydantic AI gives every run one")
    return context.run_id


def conversation_of(context: RunContext[Any]) -> str:
    if not context.conversation_id:
        raise RuntimeError("a durable Pydantic AI run has no conversation_id: Pydantic AI gives every run one")
    return context.conversation_id


def _asking(
    messages: Sequence[ModelMessage], call_id: str | None, latest: ModelResponse | None = None
) -> tuple[ModelResponse, int, int] | None:
    """The latest response that asked for *call_id*, its place in the history and the call's index in it. Or
    *latest*, the run's last response, at the end of the history it is not in yet: ``run_stream`` runs the
    calls of a response that ends the run (a deferred call beside others) before it appends the response."""
    for position in range(len(messages) - 1, -1, -1):
        response = messages[position]
        if isinstance(response, ModelResponse):
            calls = [part for part in response.parts if isinstance(part, ToolCallPart)]
            for index, part in enumerate(calls):
                if part.tool_call_id == call_id:
                    return response, position, index
    calls = [part for part in latest.parts if isinstance(part, ToolCallPart)] if latest is not None else []
    at = next((i for i, part in enumerate(calls) if part.tool_call_id == call_id), None)
    return (latest, len(messages), at) if latest is not None and at is not None else None


def _as_message(response: ModelResponse, position: int) -> Message:
    calls = [
        ToolCallBlock(part.tool_call_id, part.tool_name, part.args_as_dict())
        for part in response.parts
        if isinstance(part, ToolCallPart)
    ]
    return Message.assistant("", calls, message_id=response_id(position))


def _ledger_tool(
    name: str,
    args: Mapping[str, Any],
    body: Body,
    policy: ToolPolicy,
    kept: tuple[list[Exception], list[object]],
    transactions: str | None,
) -> Tool:
    """The call as the ledger runs it: Pydantic AI's own body (it validated the arguments and runs the real tool),
    answering with the encoded result the ledger records; an exception it raised is kept in *kept[0]*. A body
    that paused (it raised ``ApprovalRequired`` or ``CallDeferred``, which Pydantic AI encodes as a result) is no
    result: kept in *kept[1]*, it pauses the call unrecorded, so that the call runs again once answered.

    A transactional tool's body runs inside its record's transaction, which it reads with
    ``current_transaction()``. On SQLite (*transactions* ``"sync"``) Pydantic AI's call of the body runs in the
    thread that holds the transaction, on an event loop of that thread's: the run's own loop may be the one whose
    other storage calls wait for the transaction's lock (the process's one SQLite connection), and would never
    run the body."""
    raised, paused = kept
    transactional = policy.effect is Effect.TRANSACTIONAL

    async def run(**given: Any) -> ToolOutput:
        try:
            if transactional:
                loop = sync_loop() if transactions == "async" else None  # (PostgreSQL's connection's loop)
                transaction = Transaction(given[TX_PARAM], loop)
                try:
                    with in_transaction(transaction):
                        payload = await body()
                finally:  # (cancelled while its thread runs a statement: the transaction ends after it)
                    await statements_done(transaction)
            else:
                payload = await body()
        except Exception as exc:
            raised.append(exc)
            raise
        if isinstance(payload, Mapping) and payload.get("kind") in PAUSES:
            if transactional:
                raise PausedInTransaction(payload)
            paused.append(payload)
            kind = APPROVAL if payload.get("kind") == "approval_required" else QUESTION
            raise GraphInterrupt([Interrupt(f"{name}:{kind}", kind, tool=name)])
        return ToolOutput(payload)

    in_thread = transactional and transactions == "sync"

    def run_in_thread(**given: Any) -> ToolOutput:  # SQLite: in the thread that holds the transaction
        return asyncio.run(run(**given))  # (not on the run's loop: that loop may wait for the transaction's lock)

    return Tool(
        name=name,
        description="",
        fn=run_in_thread if in_thread else run,
        parameters={"type": "object", "properties": {arg: {} for arg in args}},
        is_async=not in_thread,
        on_in_doubt=policy.on_in_doubt,
        reconcile=policy.reconcile,
        effect=policy.effect,
    )


async def _payload(execution: ToolExecution, raised: list[Exception]) -> object:
    """What Pydantic AI gets for the call: its recorded result; for a failed call, the exception it raised here,
    or (replayed, in doubt, timed out) Pydantic AI's ``ToolFailed``, which the model sees as the call's failure
    (raised where the recorded result is unwrapped, as a tool that raises it is answered)."""
    result = execution.result
    if not result.is_error:
        return result.output
    if raised and not execution.replayed:
        raise raised[-1]
    raise ToolFailed(result.output if isinstance(result.output, str) else str(result.output))
