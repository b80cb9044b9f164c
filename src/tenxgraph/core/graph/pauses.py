"""The run loop's side of pauses: reading a thread's answers to its interrupts from the ledger, checking a
:class:`~tenxgraph.core.tools.interrupts.Resume` against what the thread waits for, and recording its decisions.

Exactly one decision per interrupt: decisions are recorded under the run lock, in the ledger, whose first write
wins. A decision equal to the one recorded is answered idempotently (nothing is recorded, nothing runs again); a
different one is refused (:class:`InterruptDecidedError`), and so is an answer to an interrupt the thread never
asked for, or no longer asks for (an approval for arguments that changed has another id)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

from tenxgraph.core.crashpoints import crash_point
from tenxgraph.core.tools.interrupts import APPROVAL, Interrupt, Resume, check_approval_value, decision_key
from tenxgraph.state.messages import JSON
from tenxgraph.storage.checkpointer.base import BaseCheckpointer
from tenxgraph.utils.errors import ConfigError, InterruptDecidedError, SerializationError
from tenxgraph.utils.events import emit_event

DECISION_VERSION = 1


def asked_of(interrupts: Iterable[Mapping[str, JSON]]) -> list[Interrupt]:
    """The interrupts a thread's ``meta.interrupts`` holds."""
    return [Interrupt.from_dict(i) for i in interrupts]


def waiting(asked: Sequence[Interrupt], decisions: Mapping[str, JSON]) -> list[Interrupt]:
    """The interrupts still without a decision."""
    return [i for i in asked if i.id not in decisions]


def decision_keys(resume: Resume | None) -> list[str]:
    """The ledger keys of the decisions *resume* brings (what :func:`load_decisions` reads first)."""
    return [decision_key(i) for i in resume.decisions] if resume is not None else []


async def load_decisions(checkpointer: BaseCheckpointer, thread_id: str, ids: Iterable[str]) -> dict[str, JSON]:
    """The recorded decision of each of *ids* that has one (one ledger read)."""
    keys = {decision_key(i): i for i in dict.fromkeys(ids)}
    if not keys:
        return {}
    records = await checkpointer.aget_tool_results(thread_id, list(keys))
    found: dict[str, JSON] = {}
    for key, record in records.items():
        if record.get("kind") == "decision":
            found[keys[key]] = record.get("value")
    return found


def _check(resume: Resume, asked: Sequence[Interrupt], decided: Mapping[str, JSON], thread_id: str) -> dict[str, JSON]:
    """The decisions of *resume* still to record; the errors of a Resume that cannot be taken, before any is."""
    by_id = {i.id: i for i in asked}
    new: dict[str, JSON] = {}
    for interrupt_id, value in resume.resolve(waiting(asked, decided), thread_id).items():
        if interrupt_id in decided:
            if decided[interrupt_id] != value:
                raise InterruptDecidedError(thread_id, interrupt_id, decided[interrupt_id], value)
            continue  # the same decision again (a retried request, a double click): answered as it stands
        interrupt = by_id.get(interrupt_id)
        if interrupt is None:
            pending = [i.id for i in waiting(asked, decided)]
            raise ConfigError(
                f"thread {thread_id!r} has no pending interrupt {interrupt_id!r} (pending: {pending or 'none'}); an "
                "approval belongs to one call with its exact arguments: take the ids from result.interrupts"
            )
        if interrupt.kind == APPROVAL:
            check_approval_value(interrupt_id, value)
        new[interrupt_id] = value
    return new


async def record_decisions(
    checkpointer: BaseCheckpointer, thread_id: str, resume: Resume, asked: Sequence[Interrupt], decided: dict[str, JSON]
) -> dict[str, JSON]:
    """Check *resume* against the interrupts asked and the decisions recorded (*decided*, updated in place), and
    record its new decisions in one ledger write, before anything acts on them; they are returned. A decision some
    other writer recorded first (the ledger's first write wins) is read back: equal, it stands; else refused."""
    new = _check(resume, asked, decided, thread_id)
    if not new:
        return {}
    by_id = {i.id: i for i in asked}
    records = [
        (
            decision_key(i),
            {"v": DECISION_VERSION, "kind": "decision", "interrupt": i, "about": by_id[i].kind, "value": value},
        )
        for i, value in new.items()
    ]
    written = await checkpointer.aput_tool_results(thread_id, records)
    for outcome in written:
        if isinstance(outcome, SerializationError):
            raise ConfigError(f"Resume: a decision cannot be stored ({outcome}); give JSON values") from outcome
    if not all(written):
        first = await load_decisions(checkpointer, thread_id, new)
        for interrupt_id, value in new.items():
            if interrupt_id in first and first[interrupt_id] != value:
                raise InterruptDecidedError(thread_id, interrupt_id, first[interrupt_id], value)
    decided.update(new)
    emit_event("interrupts_decided", logging.INFO, thread_id=thread_id, ids=list(new))
    crash_point("approval.after_decision")
    return new
