"""Handoffs on the OpenAI Agents SDK: a triage agent hands off to a refunds agent (an agent in ``handoffs``, or a
``Handoff`` object from ``handoff()``), whose function tools refund and email. ``replay_safe`` copies the agents
handed off to alike: a run resumed after a kill (SIGKILL inside the refunds agent's turn) or run again refunds
once, and a turn already journaled is not asked of either model again. An agent handed off to that names its
model by a string is refused, naming the fix."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, ModelResponse, Usage, handoff
from agents.models.interface import Model
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from examples.openai_agents_support.agent import FINAL, OFFLINE, make_tools
from pytest_replaysafe.run.effects import Effects
from tenxgraph.core import crashpoints
from tenxgraph.storage.checkpointer import SqliteCheckpointer
from tenxgraph.utils.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _call(name: str, arguments: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(id=f"fc_{uuid.uuid4().hex}", call_id=f"call_{uuid.uuid4().hex[:24]}", name=name,
                                    arguments=arguments, type="function_call", status="completed")  # fmt: skip


def _said(input: Any) -> list[str]:
    return [str(i.get("name")) for i in input if isinstance(i, dict) and i.get("type") == "function_call"]


class Triage(Model):
    """Hands every request to the refunds agent; asked again after the handoff's turn, says nothing more."""

    asked = 0

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        Triage.asked += 1
        return ModelResponse(output=[_call("transfer_to_refunds", "{}")], usage=Usage(), response_id="r")

    async def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


class Refunds(Model):
    """Refunds and emails in parallel; once their outputs are in, the final answer."""

    asked = 0

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        Refunds.asked += 1
        if "refund_order" in _said(input):
            text = ResponseOutputText(text=FINAL, type="output_text", annotations=[])
            answer = ResponseOutputMessage(id=f"msg_{uuid.uuid4().hex}", role="assistant", status="completed",
                                           type="message", content=[text])  # fmt: skip
            return ModelResponse(output=[answer], usage=Usage(), response_id="r")
        calls = [_call("refund_order", '{"order_id": "A-1042", "amount": 20.0}'),
                 _call("send_email", '{"to": "ada@example.com", "subject": "Your refund"}')]  # fmt: skip
        return ModelResponse(output=calls, usage=Usage(), response_id="r")

    async def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def build(effects: Any, as_object: bool = False) -> Agent[Any]:
    refunds = Agent(name="refunds", instructions="Refund.", model=Refunds(), tools=make_tools(effects))
    target: Any = handoff(refunds) if as_object else refunds
    return Agent(name="triage", instructions="Route.", model=Triage(), handoffs=[target])


async def run(folder: str, run_id: str, as_object: bool = False) -> str:
    from tenxgraph.integrations.openai_agents import replay_safe, run_replay_safe

    effects = Effects(Path(folder) / "effects.db")
    durable = replay_safe(build(effects, as_object), ledger=SqliteCheckpointer(Path(folder) / "ledger.db"),
                          run_id=run_id)  # fmt: skip
    result = await run_replay_safe(durable, "refund A-1042", run_config=OFFLINE)
    return str(result.final_output)


@pytest.mark.parametrize("as_object", [False, True], ids=["agent", "Handoff"])
def test_a_run_handed_off_refunds_once_when_run_again_and_asks_no_model_twice(tmp_path: Path, as_object: bool) -> None:
    Triage.asked = Refunds.asked = 0
    assert asyncio.run(run(str(tmp_path), "h-1", as_object)) == FINAL
    asked = (Triage.asked, Refunds.asked)
    assert asked == (1, 2)
    assert asyncio.run(run(str(tmp_path), "h-1", as_object)) == FINAL  # (a retried job: the run again)
    assert (Triage.asked, Refunds.asked) == asked  # (every turn answered from the journal)
    effects = Effects(tmp_path / "effects.db")
    assert effects.count("refund") == 1 and effects.count("email") == 1


CHILD = """
import asyncio, sys
from tests.test_openai_agents_handoffs import run
print(asyncio.run(run(sys.argv[1], "h-2")))
"""


@pytest.mark.parametrize("crash_at", ["tool.after_return", "tool.after_record", "openai_agents.after_model_record:2"])
def test_a_run_killed_in_the_agent_handed_off_to_resumes_without_a_second_refund(tmp_path: Path, crash_at: str) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-c", CHILD, str(tmp_path)]
    killed = subprocess.run(command, env={**env, crashpoints.ENV_CRASH_AT: crash_at}, cwd=ROOT, capture_output=True,
                            text=True, timeout=120, check=False)  # fmt: skip
    assert killed.returncode == -9, killed.stderr[-2000:]
    env.pop(crashpoints.ENV_CRASH_AT, None)
    resumed = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert resumed.returncode == 0 and resumed.stdout.strip().splitlines()[-1] == FINAL, resumed.stderr[-2000:]
    effects = Effects(tmp_path / "effects.db")
    assert effects.count("refund") <= 1 and effects.count("email") == 1, json.dumps(effects.count("refund"))


def test_an_agent_handed_off_to_without_a_model_object_is_refused(tmp_path: Path) -> None:
    from tenxgraph.integrations.openai_agents import replay_safe

    agent = Agent(name="triage", model=Triage(), handoffs=[Agent(name="refunds", model="gpt-4.1")])
    with pytest.raises(ConfigError, match=r"agent 'refunds' names its model by 'gpt-4\.1'.*an agent handed off to"):
        replay_safe(agent, ledger=SqliteCheckpointer(tmp_path / "ledger.db"), run_id="h-3")
