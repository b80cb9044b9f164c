from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from tenxgraph import Message, ReactAgent, Reply, ScriptedModel
from tenxgraph.errors import ConfigError, UnknownProviderError
from tenxgraph.models import ScriptExhaustedError, known_providers, register_provider, resolve_model
from tenxgraph.state.messages import JSON
from tenxgraph.utils.sync import run_sync


def test_scripted_model_reply_depends_only_on_the_conversation() -> None:
    script = [Reply(tool_calls=[("a", {"x": 1}), ("b", {})]), "final"]
    one, two = ScriptedModel(script), ScriptedModel(script)  # e.g. two processes
    convo = [Message.user("hi")]
    first = run_sync(one.agenerate(convo, []))
    again = run_sync(two.agenerate(convo, []))
    assert [(c.id, c.name, c.args) for c in first.tool_calls] == [
        ("call_1", "a", {"x": 1}),
        ("call_2", "b", {}),
    ]
    assert [c.args for c in again.tool_calls] == [c.args for c in first.tool_calls]
    assert first.message_id != again.message_id  # a regenerated message is a new message
    assert run_sync(one.agenerate([*convo, first], [])).text == "final"
    with pytest.raises(ScriptExhaustedError, match="2 replies but the conversation asks for reply #3"):
        run_sync(one.agenerate([first, first], []))


def test_provider_registry() -> None:
    assert {"google", "openai"} <= set(known_providers())
    with pytest.raises(UnknownProviderError, match=r"unknown model provider 'acme'; known providers: .*google"):
        resolve_model("x", provider="acme")
    with pytest.raises(ConfigError, match="names no provider"):
        resolve_model("gemini")
    with pytest.raises(ConfigError, match=r"'google' \(model 'gemini-2\.5-flash'\) needs an API key"):
        ReactAgent(model="google/gemini-2.5-flash", provider="google")

    class Echo:
        def __init__(self, name: str) -> None:
            self.name = name

        async def agenerate(self, messages: Sequence[Message], tools: Sequence[dict[str, JSON]]) -> Message:
            return Message.assistant(f"{self.name}: {messages[-1].text}")

    register_provider("echo-test", Echo, replace=True)
    agent = ReactAgent(model="echo-test/small", system_prompt="be brief")
    assert agent.compile().invoke({"messages": ["ping"]}, {"thread_id": "t"}).final_text == "small: ping"
    with pytest.raises(ValueError, match="already registered"):
        register_provider("echo-test", Echo)


def test_react_agent_loops_until_no_tool_is_asked_and_passes_system_prompt() -> None:
    seen: list[list[str]] = []
    calls: list[str] = []

    def lookup_order(order_id: str) -> str:
        calls.append(order_id)
        return f"order {order_id}: 20 EUR"

    def script(messages: Sequence[Message]) -> Reply | str:
        seen.append([m.role for m in messages])
        turns = sum(m.role == "assistant" for m in messages)
        return Reply(tool_calls=[("lookup_order", {"order_id": str(turns)})]) if turns < 2 else "all done"

    model = ScriptedModel([script] * 3)
    result = (
        ReactAgent(model, system_prompt=["You are support.", "Be brief."], tools=[lookup_order])
        .compile()
        .invoke({"messages": ["hi"]}, {"thread_id": "t"})
    )
    assert calls == ["0", "1"]
    assert result.final_text == "all done"
    assert [m.role for m in result.messages] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert seen[0] == ["system", "system", "user"]  # system prompt shown, not stored
    assert all(m.role != "system" for m in result.messages)


@pytest.mark.parametrize(
    "prompt",
    [
        "You are a support agent for an online shop.",
        ["You are a support agent for an online shop."],
        [{"role": "system", "content": "You are a support agent for an online shop."}],
    ],
    ids=["string", "list-of-strings", "list-of-role-dicts"],
)
def test_every_documented_system_prompt_form_reaches_the_model(prompt: Any) -> None:
    """The seed's list-of-dicts form was accepted, then the first model call raised a TypeError."""
    seen: list[str] = []

    class Recorder(ScriptedModel):
        async def agenerate(self, messages: Any, tools: Any) -> Message:
            seen.extend(m.text for m in messages if m.role == "system")
            return await super().agenerate(messages, tools)

    app = ReactAgent(Recorder(["hello"]), system_prompt=prompt).compile()
    assert app.invoke({"messages": ["hi"]}, {"thread_id": "t"}).final_text == "hello"
    assert seen == ["You are a support agent for an online shop."]


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([{"role": "user", "content": "x"}], r"system_prompt\[0\] is"),
        ([{"role": "system", "content": "x", "name": "y"}], "use only 'role' and 'content'"),
        ([42], r"system_prompt\[0\] is 42"),
        (42, "must be a string or a list"),
    ],
)
def test_other_system_prompt_forms_are_rejected_at_construction(prompt: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ReactAgent(ScriptedModel(["x"]), system_prompt=prompt)
