"""The part of the verdict about pauses for a person: every interrupt is decided once and never asked again once
its decision is recorded; a call that waited for approval runs only after its approval was recorded, and never
when it was rejected, and none of its batch (the calls of its assistant message) runs while it waits; the same
Resume sent twice changes nothing.

From the execution log: ``asked`` (the harness's person was shown an interrupt, with its kind and the call it is
about),
``decided`` (the harness's checkpointer wrapper saw the decision written), ``start`` or ``body`` (a body ran, as
the runtime said or the harness's witness saw) and
``pause_problem`` (what the harness found while answering, such as a repeated Resume that wrote the thread).

A LangGraph app's pause (``asked`` with ``via="langgraph"``) is judged by ``answered``, the answer the harness
sent (LangGraph's ``interrupt()`` ids name a task, not one question, so a written decision cannot be told
apart by the harness): a call that waited for approval runs (as the harness's witness saw its body) only after
the person's yes was sent, never after a no. Its siblings may run while it waits: LangGraph's ``ToolNode`` runs a
message's calls together, and the ledger keeps theirs for the resume."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pytest_replaysafe.judge.evidence import Entry, fingerprint

APPROVED = fingerprint(True)
#: A body began: the runtime said so (``start``) or the harness's witness saw it from inside (``body``).
RAN = ("start", "body")


def pause_problems(entries: Sequence[Entry], labels: Mapping[str, str]) -> list[str]:
    """What the log shows went wrong with the thread's pauses (nothing when it never paused)."""
    problems: list[str] = []
    decided: dict[str, tuple[int, Entry]] = {}  # interrupt id -> (position, first decided entry)
    about: dict[str, str] = {}  # interrupt id -> the call it asks about (harness identity)
    langgraph: set[str] = set()  # those asked by a LangGraph app (its siblings run as it asks; no stand-in runs)
    for n, e in enumerate(entries):
        if e.event == "answered":  # (a LangGraph pause: what the person said stands for its decision)
            decided.setdefault(e.id, (n, e))
        elif e.event == "decided":
            first = decided.setdefault(e.id, (n, e))[1]
            if first.fp != e.fp:
                problems.append(f"interrupt {e.id} was decided twice: {first.out} and then {e.out}")
        elif e.event == "asked":
            if e.id in decided and e.via != "langgraph":  # (LangGraph asks a task again as it resumes it)
                what = labels.get(e.call, e.call) if e.call else f"interrupt {e.id}"
                problems.append(
                    f"{what} was asked for again after its decision ({decided[e.id][1].out}) was recorded: a "
                    "recorded decision must be read back, never asked anew"
                )
            if e.cond == "approval" and e.call is not None:
                about.setdefault(e.id, e.call)
                if e.via == "langgraph":
                    langgraph.add(e.id)
        elif e.event == "pause_problem" and e.out:
            problems.append(e.out)
    ran = [(n, e.hid) for n, e in enumerate(entries) if e.event in RAN]
    bodies = [(n, e.hid) for n, e in enumerate(entries) if e.event == "body"]  # (the witness's own view)
    for interrupt_id, call in about.items():
        if interrupt_id not in langgraph:
            problems += _batch_problems(call, decided.get(interrupt_id), ran, labels)
        starts = [n for n, hid in (bodies if interrupt_id in langgraph else ran) if hid == call]
        if not starts:
            continue
        label = labels.get(call, call)
        decision = decided.get(interrupt_id)
        given = "given" if interrupt_id in langgraph else "recorded"  # (LangGraph's: the answer sent)
        if decision is None:
            problems.append(f"{label} ran although its approval was never {given}")
        elif decision[1].fp != APPROVED:
            problems.append(f"{label} ran although a person rejected it ({decision[1].out})")
        elif starts[0] < decision[0]:
            problems.append(f"{label} ran before its approval was {given}")
    return problems


def _batch_problems(
    call: str, decision: tuple[int, Entry] | None, ran: Sequence[tuple[int, str]], labels: Mapping[str, str]
) -> list[str]:
    """While a call of a batch (the calls of one assistant message) waits for its approval, none of the batch
    runs: no sibling's body may begin before the decision was recorded."""
    message = call.rpartition(":")[0]
    until = decision[0] if decision is not None else None
    early = sorted({hid for n, hid in ran if hid != call and hid.rpartition(":")[0] == message
                    and (until is None or n < until)})  # fmt: skip
    waited = labels.get(call, call)
    return [f"{labels.get(hid, hid)} ran while {waited} of its batch waited for approval" for hid in early]
