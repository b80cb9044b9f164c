"""The harness's witness inside tool bodies (run.witness) and the rules that compare it with the runtime's account
(judge.witnessed): the declaration it reads agrees with the runtime's documented semantics for every pair, and a
body's own outcome, key and runs are what the verdict judges, whatever the runtime's events say."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from pytest_replaysafe.judge.evidence import Entry, ExecutionLog, body_runs
from pytest_replaysafe.judge.witnessed import effect_and_policy, witness_problems
from pytest_replaysafe.run import witness
from tenxgraph import Message, ReactAgent, Reply, ScriptedModel, tool
from tenxgraph.core.tools.tool import EFFECTS, IN_DOUBT_POLICIES, Tool, ToolOutput, check_policy
from tenxgraph.utils.instrument import Instrument, install


def _plain() -> str:
    """A tool."""
    return "ok"


@pytest.mark.parametrize(
    ("effect", "on_in_doubt"), list(itertools.product((None, *EFFECTS), (None, "off", *IN_DOUBT_POLICIES)))
)
def test_the_declared_policy_is_the_one_the_tool_docs_put_in_force(effect: str | None, on_in_doubt: str | None) -> None:
    reconcile = (lambda key, args: None) if on_in_doubt == "reconcile" else None
    try:
        effect_class = check_policy(on_in_doubt, reconcile, effect)
    except ValueError:
        return  # a pair the declaration refuses
    made = Tool("t", "a tool", _plain, on_in_doubt=on_in_doubt, reconcile=reconcile, effect=effect_class)
    assert witness.declared_policy(effect, on_in_doubt) == made.policy


def test_the_witness_sees_declaration_key_outcome_and_runs_from_inside_the_bodies(tmp_path: Path) -> None:
    @tool(on_in_doubt="fail")
    def open_ticket(title: str, idempotency_key: str) -> str:
        """Open a ticket."""
        return "T-1"

    async def check_fraud(order_id: str) -> ToolOutput:
        """Check an order."""
        return ToolOutput("fraud service down", is_error=True)

    model = ScriptedModel(
        [Reply(tool_calls=[("open_ticket", {"title": "a"}), ("check_fraud", {"order_id": "1"})]), "Done."]
    )
    app = ReactAgent(model, tools=[open_ticket, check_fraud]).compile()
    log = ExecutionLog(tmp_path / "log.jsonl")
    remove = witness.install(app, log)
    unobserve = install(Instrument(on_tool=log.observe))  # the runtime's account, as the driver takes it
    try:
        result = app.invoke({"messages": [Message.text_message("go")]}, {"thread_id": "t"})
    finally:
        remove()
        unobserve()
    entries = log.entries("t")
    bodies = [e for e in entries if e.event == "body"]
    declared = sorted((e.tool, e.effect, e.policy) for e in bodies)
    assert declared == [("check_fraud", None, None), ("open_ticket", None, "fail")]
    ticket = next(e for e in bodies if e.tool == "open_ticket")
    assert ticket.ikey is not None and ticket.ikey.startswith("tenx-")
    assert sorted((e.tool, e.error) for e in entries if e.event == "body_end") == [
        ("check_fraud", True),
        ("open_ticket", False),
    ]
    assert sorted(body_runs(entries).values()) == [1, 1]
    assert [e.ikey for e in entries if e.event == "start" and e.tool == "open_ticket"] == [ticket.ikey]
    labels = {e.hid: str(e.tool) for e in bodies}
    assert witness_problems(result.messages, entries, labels) == []  # the runtime reported nothing else
    app.invoke({"messages": [Message.text_message("again")]}, {"thread_id": "t2"})
    assert log.entries("t2") == []  # removed: the bodies run unwatched


def test_a_runtime_account_that_differs_from_the_body_is_named(tmp_path: Path) -> None:
    """The runtime's events say no policy, no second run and a different key: the witness's say otherwise."""
    call = "m:0"
    runtime = Entry("t", "k", "start", "refund", ikey="reported", call=call)
    body = Entry("t", "k", "body", "refund", policy="fail", effect="external", ikey="given", call=call)
    entries = [runtime, body, Entry("t", "k", "body_end", "refund", error=True, call=call), body]
    assert body_runs(entries)[call] == 2  # one run the runtime did not report still counts
    assert effect_and_policy(entries)[call] == ("external", "fail")
    problems = witness_problems([], entries, {call: "refund()"})
    assert len(problems) == 2
    assert "declares effect external with in-doubt policy fail" in problems[0]
    assert "was given an idempotency key the runtime did not report (given; reported: reported)" in problems[1]


@pytest.mark.parametrize(
    "hints",
    [None, {}, *({"read_only_hint": r, "idempotent_hint": i} for r in (True, False, None) for i in (True, False))],
)
def test_the_witness_maps_mcp_annotations_as_the_integration_documents(hints: dict[str, object] | None) -> None:
    """The witness maps a server's annotations itself; on a correct runtime it agrees with the integration (a
    user's ToolOptions win over the annotations on both sides)."""
    types = pytest.importorskip("mcp.types", reason="the mcp extra is not installed: pip install '.[mcp]'")
    from tenxgraph.integrations.mcp.tools import ToolOptions, effect_of

    annotations = None if hints is None else types.ToolAnnotations(**hints)
    made = effect_of(annotations)
    assert witness.mcp_declaration("t", annotations, ToolOptions()) == (
        made.value,
        "fail" if made.value == "external" else None,
    )
    told = ToolOptions(effects={"t": "idempotent"})
    assert witness.mcp_declaration("t", annotations, told) == ("idempotent", None)
    retried = witness.mcp_declaration("t", annotations, ToolOptions(on_in_doubt={"t": "retry"}))
    assert retried == (made.value, "retry" if made.value == "external" else None)


def test_the_log_reads_whole_lines_only_while_a_leftover_thread_writes_one(tmp_path: Path) -> None:
    """A crashed run's leftover tool thread may be writing a line while the judge reads: the half line is left for
    the next read (seen in CI: a JSONDecodeError at an MCP cell of depth 2)."""
    log = ExecutionLog(tmp_path / "log.jsonl")
    log.write(Entry(thread="t", id="k1", event="body"))
    with log.path.open("a") as f:
        f.write('{"thread": "t", "id": "k2", "event": "bod')  # (the writer's line, half written)
    assert [e.id for e in log.entries("t")] == ["k1"]
    with log.path.open("a") as f:
        f.write('y"}\n')
    assert [(e.id, e.event) for e in log.entries("t")] == [("k1", "body"), ("k2", "body")]
