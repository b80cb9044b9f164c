"""Stable idempotency keys for tools, and opt-in in-doubt detection (intent records) on every backend."""

from __future__ import annotations

import json
import logging
from collections import Counter
from typing import Any

import pytest

from tenxgraph import Message, ReactAgent, Reply, ScriptedModel, ToolContext, tool
from tenxgraph.core import crashpoints
from tenxgraph.core.crashpoints import CrashInjected
from tenxgraph.core.graph import Tool
from tenxgraph.storage.checkpointer import BaseCheckpointer
from tests.helpers import SpyCheckpointer

MSG = {"messages": [Message.text_message("refund order 1042")]}


class Provider:
    """A payment API that honours idempotency keys and remembers every key it saw."""

    def __init__(self) -> None:
        self.applied: dict[str, str] = {}
        self.keys_seen: list[str] = []

    def refund(self, order_id: str, key: str) -> str:
        self.keys_seen.append(key)
        return self.applied.setdefault(key, f"R-{len(self.applied) + 1}")


def app(cp: BaseCheckpointer, tools: list[Any], calls: int = 1) -> Any:
    script = [Reply(tool_calls=[("refund_order", {"order_id": str(i)}) for i in range(calls)]), "done"]
    return ReactAgent(ScriptedModel(script), tools=tools).compile(cp)


def crash_then_resume(cp: BaseCheckpointer, tools: list[Any], point: str, hit: int = 1) -> Any:
    with crashpoints.armed(point, hit=hit), pytest.raises(CrashInjected):
        app(cp, tools).invoke(MSG, {"thread_id": "t"})
    return app(cp, tools).invoke(None, {"thread_id": "t"})


# -- idempotency keys ---------------------------------------------------------------------------------------
def test_idempotency_key_is_injected_and_hidden_from_the_model() -> None:
    def refund_order(order_id: str, idempotency_key: str) -> str:
        """Refund."""
        return idempotency_key

    def with_context(order_id: str, ctx: ToolContext) -> str:
        """Refund."""
        return ctx.thread_id

    schema = Tool.from_function(refund_order).schema()["parameters"]
    assert list(schema["properties"]) == ["order_id"] and schema["required"] == ["order_id"]
    assert list(Tool.from_function(with_context).schema()["parameters"]["properties"]) == ["order_id"]
    with pytest.raises(TypeError, match="idempotency_key is injected and must be a str"):

        def bad(idempotency_key: int) -> None: ...

        Tool.from_function(bad)


def test_key_is_stable_across_replays_and_differs_between_calls(checkpointer: BaseCheckpointer) -> None:
    provider = Provider()

    def refund_order(order_id: str, idempotency_key: str) -> str:
        """Refund."""
        return provider.refund(order_id, idempotency_key)

    # killed between return and record (the documented gap): the body runs twice...
    crash_then_resume(checkpointer, [refund_order], "tool.after_return")
    assert len(provider.keys_seen) == 2 and provider.keys_seen[0] == provider.keys_seen[1]
    assert len(provider.applied) == 1  # ...but with the same key, the provider refunds once
    app(checkpointer, [refund_order], calls=2).invoke(MSG, {"thread_id": "other"})
    assert len(set(provider.keys_seen)) == 3  # other calls and threads get other keys


def test_model_cannot_set_the_injected_key() -> None:
    def refund_order(order_id: str, idempotency_key: str) -> str:
        """Refund."""
        return idempotency_key

    model = ScriptedModel([Reply(tool_calls=[("refund_order", {"order_id": "1", "idempotency_key": "x"})]), "ok"])
    result = ReactAgent(model, tools=[refund_order]).compile().invoke(MSG, {"thread_id": "t"})
    assert "unknown argument(s) idempotency_key" in result.messages[2].tool_results[0].output


def test_tool_context_parameter_receives_the_call() -> None:
    seen: list[ToolContext] = []

    def refund_order(order_id: str, ctx: ToolContext) -> str:
        """Refund."""
        seen.append(ctx)
        return "ok"

    result = app(InMemoryForTest(), [refund_order]).invoke(MSG, {"thread_id": "ctx-thread"})
    assert seen[0].thread_id == "ctx-thread" and seen[0].call_id == "call_1"
    assert seen[0].message_id == result.messages[1].message_id and seen[0].key == f"{seen[0].message_id}:call_1"


def InMemoryForTest() -> BaseCheckpointer:
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer

    return InMemoryCheckpointer()


# -- the decorator -----------------------------------------------------------------------------------------
def test_decorator_validates_its_options() -> None:
    with pytest.raises(ValueError, match="on_in_doubt='maybe' is invalid"):
        tool(on_in_doubt="maybe")(lambda: None)
    with pytest.raises(ValueError, match="needs reconcile="):
        tool(on_in_doubt="reconcile")(lambda: None)
    with pytest.raises(ValueError, match="needs reconcile="):
        tool(on_in_doubt="fail", reconcile=lambda key, args: None)(lambda: None)

    @tool
    def plain() -> str:
        """Plain."""
        return "x"

    assert isinstance(plain, Tool) and plain.on_in_doubt is None


# -- in-doubt detection -------------------------------------------------------------------------------------
def policy_tool(runs: Counter[str], policy: str | None, reconcile: Any = None) -> Tool:
    def refund_order(order_id: str, idempotency_key: str) -> str:
        """Refund."""
        runs[idempotency_key] += 1
        return f"refunded {order_id}"

    if policy is None:
        return Tool.from_function(refund_order)
    return tool(on_in_doubt=policy, reconcile=reconcile)(refund_order)


def test_only_opted_in_tools_write_intents(checkpointer: BaseCheckpointer) -> None:
    spy = SpyCheckpointer(checkpointer)
    app(spy, [policy_tool(Counter(), None)], calls=2).invoke(MSG, {"thread_id": "t1"})
    assert spy.calls["put_tool_intent"] == 0 and spy.calls["put_tool_result"] == 2
    app(spy, [policy_tool(Counter(), "fail")], calls=2).invoke(MSG, {"thread_id": "t2"})
    assert spy.calls["put_tool_intent"] == 2 and spy.calls["put_tool_result"] == 4  # one extra write per call
    assert all(r.get("kind") == "value" for r in checkpointer.list_tool_results("t2").values())


@pytest.mark.parametrize("point", ["tool.after_return", "tool.before_invoke"])
def test_fail_policy_does_not_rerun_and_reports_in_doubt(
    checkpointer: BaseCheckpointer, point: str, caplog: pytest.LogCaptureFixture
) -> None:
    runs: Counter[str] = Counter()
    with caplog.at_level(logging.WARNING, logger="tenxgraph.events"):
        result = crash_then_resume(checkpointer, [policy_tool(runs, "fail")], point)
    assert sum(runs.values()) == (1 if point == "tool.after_return" else 0)  # never run again
    tool_result = result.messages[2].tool_results[0]
    assert tool_result.is_error and tool_result.status == "in_doubt" and "is in doubt" in tool_result.output
    assert result.final_text == "done"  # the run continues
    [event] = [r for r in caplog.records if r.name == "tenxgraph.events"]
    payload = json.loads(event.getMessage())
    assert payload["event"] == "tool_in_doubt" and payload["tool"] == "refund_order" and payload["thread"] == "t"
    assert event.tenxgraph_event == payload  # type: ignore[attr-defined]
    again = app(checkpointer, [policy_tool(runs, "fail")]).invoke(None, {"thread_id": "t"})
    assert again.messages[2].tool_results[0].status == "in_doubt"  # recorded: stable on later replays


def test_retry_policy_runs_again_with_the_same_key(
    checkpointer: BaseCheckpointer, caplog: pytest.LogCaptureFixture
) -> None:
    runs: Counter[str] = Counter()
    with caplog.at_level(logging.WARNING, logger="tenxgraph"):
        result = crash_then_resume(checkpointer, [policy_tool(runs, "retry")], "tool.after_return")
    assert list(runs.values()) == [2]  # one key, two runs
    assert "was in doubt" in caplog.text and result.messages[2].tool_results[0].output == "refunded 0"


def test_reconcile_uses_the_providers_answer(checkpointer: BaseCheckpointer) -> None:
    runs: Counter[str] = Counter()
    asked: list[tuple[str, dict[str, Any]]] = []

    def reconcile(key: str, args: dict[str, Any]) -> Any:
        asked.append((key, args))
        return "refunded 0 (found at the provider)" if runs[key] else None

    result = crash_then_resume(checkpointer, [policy_tool(runs, "reconcile", reconcile)], "tool.after_return")
    assert list(runs.values()) == [1] and asked[0][1] == {"order_id": "0"} and asked[0][0] in runs
    assert result.messages[2].tool_results[0].output == "refunded 0 (found at the provider)"
    # crashed before the body ran: reconcile says it did not happen, so the tool runs
    runs2: Counter[str] = Counter()
    with crashpoints.armed("tool.before_invoke"), pytest.raises(CrashInjected):
        app(checkpointer, [policy_tool(runs2, "reconcile", reconcile)]).invoke(MSG, {"thread_id": "t2"})
    resumed = app(checkpointer, [policy_tool(runs2, "reconcile", reconcile)]).invoke(None, {"thread_id": "t2"})
    assert list(runs2.values()) == [1] and resumed.messages[2].tool_results[0].output == "refunded 0"


def test_failing_reconcile_is_an_in_doubt_error_not_a_rerun(checkpointer: BaseCheckpointer) -> None:
    runs: Counter[str] = Counter()

    def reconcile(key: str, args: dict[str, Any]) -> Any:
        raise ConnectionError("provider unreachable")

    result = crash_then_resume(checkpointer, [policy_tool(runs, "reconcile", reconcile)], "tool.after_return")
    assert list(runs.values()) == [1]
    assert result.messages[2].tool_results[0].status == "in_doubt"
    assert "reconcile failed: provider unreachable" in result.messages[2].tool_results[0].output


def test_a_tool_whose_intent_cannot_be_written_does_not_run_and_the_thread_stays_resumable(
    checkpointer: BaseCheckpointer,
) -> None:
    from tenxgraph import IntentWriteError
    from tenxgraph.storage.checkpointer.delegating import DelegatingCheckpointer

    class Refusing(DelegatingCheckpointer):
        refuse = True

        async def aput_tool_intent(self, thread_id: str, key: str, record: dict[str, Any]) -> bool:
            if self.refuse:
                raise OSError(28, "No space left on device")
            return await super().aput_tool_intent(thread_id, key, record)

    ran: list[str] = []

    @tool(on_in_doubt="fail")
    def refund_order(order_id: str) -> str:
        """Refund."""
        ran.append(order_id)
        return "refunded"

    store = Refusing(checkpointer)
    with pytest.raises(IntentWriteError, match=r"tool 'refund_order' .* was not run: .*No space left on device"):
        app(store, [refund_order]).invoke(MSG, {"thread_id": "t"})
    assert ran == []  # without its intent, a crash during the call could not be detected: it does not run
    store.refuse = False
    result = app(store, [refund_order]).invoke(None, {"thread_id": "t"})
    assert ran == ["0"] and result.final_text == "done"


# -- a graph-wide default -----------------------------------------------------------------------------------
def test_a_graph_wide_default_turns_in_doubt_detection_on_for_every_tool_that_says_nothing(
    checkpointer: BaseCheckpointer,
) -> None:
    from tenxgraph.prebuilt.agent import TOOL

    runs: Counter[str] = Counter()
    plain, own = policy_tool(runs, None), policy_tool(Counter(), "retry")
    script = [Reply(tool_calls=[("refund_order", {"order_id": "1"})]), "done"]

    def graph(cp: BaseCheckpointer, tools: list[Any], default: str | None = "fail") -> Any:
        return ReactAgent(ScriptedModel(script), tools=tools).compile(cp, on_in_doubt=default)

    with crashpoints.armed("tool.after_return"), pytest.raises(CrashInjected):
        graph(checkpointer, [plain]).invoke(MSG, {"thread_id": "t"})
    result = graph(checkpointer, [plain]).invoke(None, {"thread_id": "t"})
    assert sum(runs.values()) == 1 and result.messages[2].tool_results[0].status == "in_doubt"  # the default: fail
    assert graph(checkpointer, [own]).nodes[TOOL].tools["refund_order"].policy == "retry"  # its own wins
    off = tool(on_in_doubt="off", name="refund_order")(lambda order_id: "x")
    assert graph(checkpointer, [off]).nodes[TOOL].tools["refund_order"].policy is None  # opted out
    spy = SpyCheckpointer(checkpointer)
    graph(spy, [off]).invoke(MSG, {"thread_id": "u"})
    assert spy.calls["put_tool_intent"] == 0  # "off": no intent record, whatever the default
    assert plain.policy is None  # compiling with a default never changes the tool itself


@pytest.mark.parametrize(
    ("default", "message"),
    [
        ("reconcile", r"on_in_doubt='reconcile'.*one of retry, fail; reconcile needs each tool's own function"),
        ("never", r"on_in_doubt='never'.*one of retry, fail"),
    ],
)
def test_a_graph_wide_default_is_retry_or_fail(default: str, message: str) -> None:
    from tenxgraph import ConfigError

    agent = ReactAgent(ScriptedModel(["done"]), tools=[policy_tool(Counter(), None)])
    with pytest.raises(ConfigError, match=message):
        agent.compile(on_in_doubt=default)


# -- effect classes -----------------------------------------------------------------------------------------
def test_effect_classes_say_what_a_rerun_means(checkpointer: BaseCheckpointer) -> None:
    runs: Counter[str] = Counter()

    @tool(effect="read")
    def lookup_order(order_id: str) -> str:
        """Look an order up."""
        runs["lookup"] += 1
        return f"order {order_id}"

    @tool(effect="idempotent")
    def refund_order(order_id: str, idempotency_key: str) -> str:
        """Refund."""
        return idempotency_key

    @tool(effect="external")
    def send_email(to: str) -> str:
        """Send an email."""
        return "sent"

    assert (lookup_order.policy, refund_order.policy, send_email.policy) == (None, None, "fail")
    assert not lookup_order.recorded and refund_order.recorded and send_email.recorded
    script = [Reply(tool_calls=[("lookup_order", {"order_id": "1"}), ("refund_order", {"order_id": "1"})]), "done"]
    spy = SpyCheckpointer(checkpointer)
    ReactAgent(ScriptedModel(script), tools=[lookup_order, refund_order]).compile(spy, on_in_doubt="fail").invoke(
        MSG, {"thread_id": "t"}
    )
    records = checkpointer.list_tool_results("t")
    assert len(records) == 1 and spy.calls["put_tool_intent"] == 0  # a read costs no write; idempotent no intent
    # a read is not replayed: after a crash before the node completed, it simply runs again
    with crashpoints.armed("node.after_complete"), pytest.raises(CrashInjected):
        ReactAgent(ScriptedModel(script), tools=[lookup_order, refund_order]).compile(checkpointer).invoke(
            MSG, {"thread_id": "u"}
        )
    before = runs["lookup"]
    ReactAgent(ScriptedModel(script), tools=[lookup_order, refund_order]).compile(checkpointer).invoke(
        None, {"thread_id": "u"}
    )
    assert runs["lookup"] == before + 1


def test_effect_classes_refuse_what_contradicts_them() -> None:
    with pytest.raises(ValueError, match="effect='write' is invalid; use one of read, idempotent, external"):
        tool(effect="write")(lambda: None)
    with pytest.raises(ValueError, match="a read tool may simply run again, so it has nothing to be in doubt about"):
        tool(effect="read", on_in_doubt="fail")(lambda: None)
    with pytest.raises(ValueError, match="an external effect is always watched"):
        tool(effect="external", on_in_doubt="off")(lambda: None)

    def refund(order_id: str) -> str:
        """Refund."""
        return order_id

    with pytest.raises(TypeError, match="declare a parameter idempotency_key: str"):
        tool(effect="idempotent")(refund)
    assert tool(effect="external", on_in_doubt="retry")(refund).policy == "retry"  # its own policy wins


def test_a_failed_ledger_read_never_runs_a_tool_with_an_in_doubt_policy(checkpointer: BaseCheckpointer) -> None:
    from tenxgraph import LedgerReadError

    runs: Counter[str] = Counter()
    with crashpoints.armed("ledger.read_error", action="fault"), pytest.raises(LedgerReadError, match="refund_order"):
        app(checkpointer, [policy_tool(runs, "fail")]).invoke(MSG, {"thread_id": "t"})
    assert sum(runs.values()) == 0  # it never ran without knowing whether it had
    result = app(checkpointer, [policy_tool(runs, "fail")]).invoke(None, {"thread_id": "t"})
    assert sum(runs.values()) == 1 and result.final_text == "done"  # resumable; then it runs once
    with crashpoints.armed("ledger.read_error", action="fault"):  # a tool without a policy still runs
        app(checkpointer, [policy_tool(runs, None)]).invoke(MSG, {"thread_id": "v"})
    assert sum(runs.values()) == 2


def test_an_effect_class_is_an_enum_that_reads_as_its_name() -> None:
    from tenxgraph.core.tools.effects import Effect

    def send(to: str) -> str:
        return to

    def charge(to: str, idempotency_key: str) -> str:
        return to

    made = [
        tool(effect="read")(send).effect,
        tool(effect="idempotent")(charge).effect,
        tool(effect="external")(send).effect,
    ]
    assert made[0] is Effect.READ and made[2] is Effect.EXTERNAL and made == ["read", "idempotent", "external"]
    assert tool(effect=Effect.EXTERNAL)(send).policy == "fail"  # the enum itself is accepted, with its meaning
    assert [e.may_run_again for e in Effect] == [True, True, False, True]
    assert tool()(send).effect is None
