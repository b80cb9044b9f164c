"""The ``approvals`` fixture on a Pydantic AI agent: a run whose output is ``DeferredToolRequests`` (a tool with
``requires_approval``) is answered as Pydantic AI's docs answer one, by a run given ``deferred_tool_results``, until
the run's output is no longer a pause: through ``aresume_once`` on the durable agent (the answer recorded in the
ledger first, so k processes sending it at once run the rest of the run once), by a plain run on the bare one.

Each deferred call is shown to the person as a :class:`~tenxgraph.Interrupt` (id: its ``tool_call_id``; its tool,
arguments and response), so that one ``approvals.answer(rule)`` serves every runtime: a call that needs approval
(``requires_approval``, ``ApprovalRequired``) is of kind ``approval``: ``True`` approves, ``False`` or a reason
string denies (``ToolDenied(reason)``); a call deferred as external (``CallDeferred``: its result comes from
elsewhere, a job, a webhook) is of kind ``interrupt``, and the answer is the call's result
(``DeferredToolResults(calls=...)``). The harness logs what it was asked
(``asked``, ``via="pydantic_ai"``: a resumed run comes back with its deferred calls again, and asks again) and, for a
bare agent (no ledger to record the answer in), what it answered (``answered``); the durable agent's decisions are
the ledger writes its checkpointer wrapper sees (``decided``). The pause's crash points: ``approval.after_pause``
(the run came back paused; nobody has answered), fired here, and ``approval.after_decision`` (the answer is
recorded; the run that takes it has not begun), fired by ``aresume_once``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import pytest

from pytest_replaysafe.judge.evidence import ExecutionLog, call_id_of
from pytest_replaysafe.run.approvals import MAX_ROUNDS
from tenxgraph.core.crashpoints import crash_point
from tenxgraph.core.tools.interrupts import APPROVAL, QUESTION, Interrupt

if TYPE_CHECKING:
    from pytest_replaysafe.run.approvals import Approvals, AtOnce
    from tenxgraph.state.messages import JSON

#: The ``via`` of what the harness logs about a Pydantic AI agent's pauses (see the verdict's pauses).
VIA = "pydantic_ai"


def is_paused(output: object) -> bool:
    """A run's output that is a pause: ``DeferredToolRequests``."""
    return any(c.__name__ == "DeferredToolRequests" for c in type(output).__mro__)


def as_interrupts(requests: Any, messages: Sequence[Any]) -> list[tuple[Interrupt, str | None]]:
    """The deferred calls of *requests* as the person is shown them, each with the harness's identity of its call
    (its response's place in *messages*, the run's history, and its index there)."""
    from pytest_replaysafe.run.pydantic_ai_watch import asking
    from tenxgraph.integrations.pydantic_ai.backend import response_id

    out: list[tuple[Interrupt, str | None]] = []
    external = {call.tool_call_id for call in requests.calls}
    for call in [*requests.approvals, *requests.calls]:
        found = asking(messages, call.tool_call_id)
        message_id = response_id(found[0]) if found is not None else None
        args: JSON = call.args_as_dict()
        kind = QUESTION if call.tool_call_id in external else APPROVAL
        asked = Interrupt(call.tool_call_id, kind, value={"tool": call.tool_name, "args": args},
                          tool=call.tool_name, args=args, message_id=message_id, call_id=call.tool_call_id)  # fmt: skip
        out.append((asked, call_id_of(message_id, found[1]) if found is not None and message_id else None))
    return out


def answer(decision: JSON) -> Any:
    """The person's decision as Pydantic AI takes it: ``True`` approves, ``False`` denies, a string denies with
    that reason."""
    from pydantic_ai import ToolDenied

    if isinstance(decision, bool):
        return decision
    if isinstance(decision, str):
        return ToolDenied(decision)
    raise pytest.UsageError(
        f"approvals.answer: a Pydantic AI approval is answered True, False or a reason string; got {decision!r}"
    )


def answer_deferred(
    output: object,
    messages: Callable[[], Sequence[Any]],
    send: Callable[[Any, list[Any]], object],
    where: tuple[str, bool],
    approvals: Approvals,
    log: ExecutionLog,
    at_once: AtOnce | None = None,
) -> None:
    """Answer a run that came back paused (*output*), and every pause after it, until the run ends: *messages()*
    is the paused run's history, *send(results, history)* runs the agent once with ``deferred_tool_results`` on
    it and returns its output (each process of the ``resumers`` mode on the history read here: the run that takes
    the answer saves its own). *where*: the thread, and whether the agent is bare (its answers logged as
    given)."""
    from pydantic_ai import DeferredToolResults

    thread, bare = where
    for _ in range(MAX_ROUNDS):
        if not is_paused(output):
            return
        crash_point("approval.after_pause")
        history = list(messages())
        asked = as_interrupts(output, history)
        decisions = approvals.ask(thread, asked, log, VIA, bare)
        kinds = {interrupt.id: interrupt.kind for interrupt, _ in asked}
        results = DeferredToolResults(
            approvals={i: answer(d) for i, d in decisions.items() if kinds[i] == APPROVAL},
            calls={i: d for i, d in decisions.items() if kinds[i] == QUESTION},  # (an external call's result)
        )
        if at_once is not None:
            at_once(partial(send, results, history))
        output = send(results, history)
    raise RuntimeError(f"thread {thread!r} paused {MAX_ROUNDS} times in one drive: a pause that never ends?")
