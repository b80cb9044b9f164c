"""The part of the verdict about pauses for a person: every interrupt is decided once and never asked again once
its decision is recorded; a call that waited for approval runs only after its approval was recorded, and never
when it was rejected, and none of its batch (the calls of its assistant message) runs while it waits; the same
Resume sent twice changes nothing.

From the execution log: ``asked`` (the harness's person was shown an interrupt, with its kind and the call it is
about),
``decided`` (the harness's checkpointer wrapper saw the decision written), ``start`` or ``body`` (a body ran, as
the runtime said or the harness's witness saw; ``cond="needs_approval"``: an OpenAI Agents SDK tool that needs
approval, as the harness read it on the tool, which must not run unasked) and ``pause_problem`` (what the harness
found while answering, such as a repeated Resume that wrote the thread).

A LangGraph app's pause (``asked`` with ``via="langgraph"``) is judged by ``answered``, the answer the harness
sent (LangGraph's ``interrupt()`` ids name a task, not one question, so a written decision cannot be told
apart by the harness): a call that waited for approval runs (as the harness's witness saw its body) only after
the person's yes was sent, never after a no. Its siblings may run while it waits: LangGraph's ``ToolNode`` runs a
message's calls together, and the ledger keeps theirs for the resume.

A Pydantic AI agent's pause (``via="pydantic_ai"``) is judged the same way (its run runs a response's other calls
before it returns the deferred ones; resumed, it comes back with them and asks again), by the decision recorded in
the ledger (``decided``) on the durable agent, by the answer sent (``answered``) on a bare one, which records
none. An OpenAI Agents SDK run's pause (``via="openai_agents"``) likewise, except that it is never asked again
once decided (the answered ``RunState`` is what a resume sends)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pytest_replaysafe.judge.evidence import Entry, fingerprint

APPROVED = fingerprint(True)
#: The ``cond`` of a body whose tool needs a person's approval on the tool itself (the harness read it there).
NEEDS_APPROVAL = "needs_approval"
#: A body began: the runtime said so (``start``) or the harness's witness saw it from inside (``body``).
RAN = ("start", "body")
#: The frameworks whose runs ask a pause again as they resume it, and run its siblings while it waits.
ASKED_AGAIN = ("langgraph", "pydantic_ai")
#: The frameworks whose runs run a pause's siblings while it waits (the OpenAI Agents SDK runs a response's other
#: calls before it returns the interrupted ones; resumed from the answered ``RunState``, it does not ask again).
SIBLINGS_RUN = (*ASKED_AGAIN, "openai_agents")


def pause_problems(entries: Sequence[Entry], labels: Mapping[str, str]) -> list[str]:
    """What the log shows went wrong with the thread's pauses (nothing when it never paused)."""
    problems: list[str] = []
    decided: dict[str, tuple[int, Entry]] = {}  # interrupt id -> (position, first decided entry)
    about: dict[str, str] = {}  # interrupt id -> the call it asks about (harness identity)
    framework: dict[str, str] = {}  # those a framework asked (SIBLINGS_RUN: its siblings run as it asks) -> it
    for n, e in enumerate(entries):
        if e.event == "answered":  # (a LangGraph pause: what the person said stands for its decision)
            decided.setdefault(e.id, (n, e))
        elif e.event == "decided":
            first = decided.setdefault(e.id, (n, e))[1]
            if first.fp != e.fp:
                problems.append(f"interrupt {e.id} was decided twice: {first.out} and then {e.out}")
        elif e.event == "asked":
            if e.id in decided and e.via not in ASKED_AGAIN:  # (LangGraph asks a task again as it resumes it)
                what = labels.get(e.call, e.call) if e.call else f"interrupt {e.id}"
                problems.append(
                    f"{what} was asked for again after its decision ({decided[e.id][1].out}) was recorded: a "
                    "recorded decision must be read back, never asked anew"
                )
            if e.cond == "approval" and e.call is not None:
                about.setdefault(e.id, e.call)
                if e.via in SIBLINGS_RUN:
                    framework[e.id] = e.via
        elif e.event == "pause_problem" and e.out:
            problems.append(e.out)
    asked = set(about.values())
    for label in sorted({labels.get(e.hid, e.hid) for e in entries if e.event == "body" and e.cond == NEEDS_APPROVAL
                         and e.hid not in asked}):  # fmt: skip
        problems.append(
            f"{label} ran although no person was asked: its tool needs approval (needs_approval=True), and the run "
            "never paused for it"
        )
    ran = [(n, e.hid) for n, e in enumerate(entries) if e.event in RAN]
    bodies = _bodies(entries)  # (the witness's own view)
    for interrupt_id, call in about.items():
        if interrupt_id not in framework:
            problems += _batch_problems(call, decided.get(interrupt_id), ran, labels)
        starts = [n for n, hid in (bodies if interrupt_id in framework else ran) if hid == call]
        if not starts:
            continue
        label = labels.get(call, call)
        decision = decided.get(interrupt_id)
        sent = decision[1].event == "answered" if decision else framework.get(interrupt_id) == "langgraph"
        given = "given" if sent else "recorded"  # (LangGraph's, a bare Pydantic AI agent's: the answer sent)
        if decision is None:
            problems.append(f"{label} ran although its approval was never {given}")
        elif decision[1].fp != APPROVED:
            problems.append(f"{label} ran although a person rejected it ({decision[1].out})")
        elif starts[0] < decision[0]:
            problems.append(f"{label} ran before its approval was {given}")
        if framework.get(interrupt_id) == "pydantic_ai":
            problems += _taken_again(label, [n for n, e in enumerate(entries) if e.event == "answered"
                                             and e.id == interrupt_id], starts)  # fmt: skip
    return problems


def _taken_again(label: str, answers: Sequence[int], starts: Sequence[int]) -> list[str]:
    """A bare Pydantic AI agent's approval (*answers*: the positions of each answer sent to one pause; *starts*:
    of the call's body): the call ran on more than one of them, a resumed run's answer taken again."""
    taken = {max((a for a in answers if a < n), default=None) for n in starts} - {None}
    if len(taken) < 2:
        return []
    return [
        f"{label} ran on {len(taken)} answers to its one approval: the resumed run came back paused, its person "
        "was asked again, and the answer was taken again (pydantic/pydantic-ai#5536; LedgerDurability records "
        "an answer once, and resume_once hands a repeated one the run that took it)"
    ]


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


def _bodies(entries: Sequence[Entry]) -> list[tuple[int, str]]:
    """Where each body the witness saw began (position, call), less those that paused (``body_paused``: a body
    that raised its framework's pause, such as Pydantic AI's ``ApprovalRequired``, asked and did not run)."""
    began: dict[str, list[int]] = {}
    for n, e in enumerate(entries):
        if e.event == "body":
            began.setdefault(e.hid, []).append(n)
        elif e.event == "body_paused" and began.get(e.hid):
            began[e.hid].pop()
    return sorted((n, hid) for hid, starts in began.items() for n in starts)
