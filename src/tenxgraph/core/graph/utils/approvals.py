"""Approvals, step 2b of the ledger: before anything of a batch runs, a call whose tool asks for a person's approval
(``@tool(approval=...)``, for these arguments) runs only once it was approved; a rejected call is answered with its
rejection, never run; while any call of the batch waits, none runs. And the attempt number of a call whose body
paused with ``interrupt()`` (its intent is the attempt's own).

Called by the ledger (:mod:`.invoke_node_handler`); it decides, and the ledger records (the rejections) or pauses
(raises :class:`~tenxgraph.core.tools.interrupts.GraphInterrupt`): nothing here writes or calls back."""

from __future__ import annotations

from dataclasses import dataclass, field

from tenxgraph.core.graph.utils.ledger_record import LedgerCall, ToolExecution, error_execution
from tenxgraph.core.tools.interrupts import (
    APPROVAL,
    REJECTED,
    Interrupt,
    Pauses,
    approval_id,
    call_interrupt_id,
    is_approved,
    rejection_text,
)
from tenxgraph.core.tools.tool import ToolArgumentError
from tenxgraph.state.messages import JSON


@dataclass
class Approvals:
    """What the approvals of a batch allow: the calls that may run, the rejected ones with their answer (to be
    recorded), and the approvals still waited for."""

    runnable: list[LedgerCall] = field(default_factory=list)
    rejected: list[tuple[LedgerCall, ToolExecution]] = field(default_factory=list)
    waiting: list[Interrupt] = field(default_factory=list)


def check_approvals(calls: list[LedgerCall], pauses: Pauses, node: str | None) -> Approvals:
    """Sort *calls* by their approval: not needed or approved (run), rejected (answered), or not decided (wait).
    A call with arguments the tool refuses needs none: it is answered with its error without running."""
    out = Approvals()
    for call in calls:
        tool = call.tool
        if tool is None or tool.approval is False:
            out.runnable.append(call)
            continue
        try:
            args = tool.parse_args(call.block.args)
        except ToolArgumentError:
            out.runnable.append(call)
            continue
        if not tool.needs_approval(args):
            out.runnable.append(call)
            continue
        asked = approval_id(call.info.execution_id, args)
        if asked not in pauses.decisions:
            info = call.info
            about: dict[str, JSON] = {"tool": call.name, "args": args}
            out.waiting.append(Interrupt(asked, APPROVAL, about, call.name, args, info.message_id, info.call_id, node))
        elif is_approved(pauses.decisions[asked]):
            out.runnable.append(call)
        else:
            text = rejection_text(call.name, pauses.decisions[asked])
            out.rejected.append((call, error_execution(call.block, call.key, text, status=REJECTED)))
    return out


def attempt_of(call: LedgerCall, pauses: Pauses) -> int:
    """How many pauses of the call's body (``interrupt()``, in order) have been answered: its attempt number."""
    attempt = 0
    while call_interrupt_id(call.info.execution_id, attempt) in pauses.decisions:
        attempt += 1
    return attempt
