"""The verdict on a LangGraph app's pauses (pytest_replaysafe.judge.pauses), from the facts the harness saw
itself: what it was asked, what it answered, and the bodies its witness saw begin. LangGraph asks a task again as
it resumes it, and runs a paused call's siblings while it waits; neither is a problem, a body that begins before
the person's yes or after a no is."""

from __future__ import annotations

from pytest_replaysafe.judge.evidence import Entry, fingerprint
from pytest_replaysafe.judge.pauses import pause_problems

T, REFUND, EMAIL = "t1", "ai-1:0", "ai-1:1"
LABELS = {REFUND: "refund_order(order_id='1042')", EMAIL: "send_email(to='ada')"}


def asked() -> Entry:
    return Entry(T, "i-1", "asked", "refund_order", call=REFUND, cond="approval", via="langgraph")


def answered(value: object) -> Entry:
    return Entry(T, "i-1", "answered", fp=fingerprint(value), out=repr(value))


def body(call: str) -> Entry:
    return Entry(T, f"key-{call}", "body", call=call, via="langgraph")


def start(call: str) -> Entry:  # the runtime's own account (a rejection's stand-in says start too)
    return Entry(T, f"key-{call}", "start", call=call)


def test_an_approved_call_that_runs_after_the_yes_holds_and_its_siblings_may_run_while_it_waits() -> None:
    entries = [asked(), body(EMAIL), asked(), answered(True), body(REFUND)]
    assert pause_problems(entries, LABELS) == []


def test_a_rejected_call_whose_body_never_began_holds_whatever_the_runtime_says() -> None:
    assert pause_problems([asked(), answered("no receipt"), start(REFUND)], LABELS) == []


def test_a_body_after_a_no_is_caught() -> None:
    (problem,) = pause_problems([asked(), answered(False), body(REFUND)], LABELS)
    assert problem.startswith("refund_order(order_id='1042') ran although a person rejected it")


def test_a_body_before_the_yes_is_caught() -> None:
    (problem,) = pause_problems([asked(), body(REFUND), answered(True)], LABELS)
    assert problem == "refund_order(order_id='1042') ran before its approval was given"


def test_a_body_never_answered_is_caught() -> None:
    (problem,) = pause_problems([asked(), body(REFUND)], LABELS)
    assert problem == "refund_order(order_id='1042') ran although its approval was never given"
