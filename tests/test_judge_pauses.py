"""The verdict on a LangGraph app's and a Pydantic AI agent's pauses (pytest_replaysafe.judge.pauses), from the
facts the harness saw itself: what it was asked, what it answered or saw recorded, and the bodies its witness saw
begin. Both frameworks ask a pause again as they resume it, and run a paused call's siblings while it waits;
neither is a problem, a body that begins before the person's yes or after a no is, and so is a Pydantic AI call
that runs on a second answer to its one approval."""

from __future__ import annotations

from pytest_replaysafe.judge.evidence import Entry, fingerprint
from pytest_replaysafe.judge.pauses import pause_problems

T, REFUND, EMAIL = "t1", "ai-1:0", "ai-1:1"
LABELS = {REFUND: "refund_order(order_id='1042')", EMAIL: "send_email(to='ada')"}


def asked(via: str = "langgraph") -> Entry:
    return Entry(T, "i-1", "asked", "refund_order", call=REFUND, cond="approval", via=via)


def answered(value: object) -> Entry:
    return Entry(T, "i-1", "answered", fp=fingerprint(value), out=repr(value))


def decided(value: object) -> Entry:  # the harness's checkpointer wrapper saw the decision written
    return Entry(T, "i-1", "decided", fp=fingerprint(value), out=repr(value))


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


def test_a_durable_pydantic_ai_pause_asked_again_after_its_recorded_yes_holds() -> None:
    """A resumed Pydantic AI run comes back with its deferred calls again: the harness's person is asked again;
    the call ran once, after the recorded yes."""
    via = "pydantic_ai"
    entries = [asked(via), body(EMAIL), decided(True), body(REFUND), asked(via), decided(True)]
    assert pause_problems(entries, LABELS) == []


def test_a_durable_pydantic_ai_call_that_runs_with_no_recorded_decision_is_caught() -> None:
    (problem,) = pause_problems([asked("pydantic_ai"), body(REFUND)], LABELS)
    assert problem == "refund_order(order_id='1042') ran although its approval was never recorded"


def test_a_bare_pydantic_ai_call_run_on_a_second_answer_is_caught_and_one_answer_is_not() -> None:
    """pydantic/pydantic-ai#5536: the run that resumes the pause is answered again and runs the call again. The
    same call run twice on one answer (a crash in its body, then its retry in the same run) is not this."""
    via = "pydantic_ai"
    twice = [asked(via), answered(True), body(REFUND), asked(via), answered(True), body(REFUND)]
    (problem,) = pause_problems(twice, LABELS)
    assert problem.startswith("refund_order(order_id='1042') ran on 2 answers to its one approval")
    once = [asked(via), answered(True), body(REFUND), body(REFUND), asked(via), answered(True)]
    assert pause_problems(once, LABELS) == []
