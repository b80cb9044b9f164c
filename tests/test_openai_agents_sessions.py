"""An OpenAI Agents SDK run on a session (``run_replay_safe(..., session=...)``), killed (SIGKILL) at points
inside its turns and run again on the same session, as a retried job would: the refund and the email happen
once, and the session holds each of the run's items once, as after a run that never crashed. A session that
was cleared since the run began is refused, naming the fix."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from pytest_replaysafe.run.effects import Effects
from tenxgraph.core import crashpoints
from tenxgraph.utils.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]

#: One run of the job: the agent on its session ``conv`` and run id ``job-1``; prints the final output.
JOB = """
import asyncio, sys
from agents import SQLiteSession
from examples.openai_agents_support.agent import OFFLINE, build_agent
from pytest_replaysafe.run.effects import Effects
from tenxgraph.integrations.openai_agents import replay_safe, run_replay_safe
from tenxgraph.storage.checkpointer import SqliteCheckpointer

async def main(folder):
    durable = replay_safe(build_agent(Effects(folder + "/effects.db")),
                          ledger=SqliteCheckpointer(folder + "/ledger.db"), run_id="job-1")
    session = SQLiteSession("conv", folder + "/sessions.db")
    result = await run_replay_safe(durable, "refund A-1042", session=session, run_config=OFFLINE)
    print(result.final_output)

asyncio.run(main(sys.argv[1]))
"""


def job(folder: Path, crash_at: str | None = None, script: str = JOB) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop(crashpoints.ENV_CRASH_AT, None)
    if crash_at:
        env[crashpoints.ENV_CRASH_AT] = crash_at
    command = [sys.executable, "-c", script, str(folder)]
    return subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def session_items(folder: Path) -> list[Any]:
    from agents import SQLiteSession

    return asyncio.run(SQLiteSession("conv", str(folder / "sessions.db")).get_items())


def shape(items: list[Any]) -> list[str]:
    return [str(i.get("type") or i.get("role")) for i in items]


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    """A run that never crashed: its final output and its session's items (their kinds)."""
    folder = tmp_path_factory.mktemp("clean")
    done = job(folder)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1], shape(session_items(folder))


@pytest.mark.parametrize(
    "crash_at",
    [
        "openai_agents.after_model_record",
        "tool.in_flight",
        "tool.after_return",
        "tool.after_record",
        "openai_agents.after_model_record:2",
        "tool.after_record:2",
    ],
)
def test_a_run_killed_on_its_session_resumes_once_and_its_session_holds_each_item_once(
    tmp_path: Path, crash_at: str, clean: tuple[str, list[str]]
) -> None:
    crashed = job(tmp_path, crash_at)
    assert crashed.returncode == -9, crashed.stderr[-2000:]  # (killed at the point)
    resumed = job(tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert resumed.stdout.strip().splitlines()[-1] == clean[0]
    effects = Effects(tmp_path / "effects.db")
    assert effects.count("refund") <= 1 and effects.count("email") == 1  # (a refund killed in flight: in doubt)
    items = session_items(tmp_path)
    assert shape(items) == clean[1], shape(items)
    assert len({str(i.get("call_id")) for i in items if i.get("type") == "function_call"}) == 2


def test_a_run_without_the_rewind_is_caught_by_this_test(tmp_path: Path) -> None:
    """The SDK's session alone under the same kill (``Runner.run`` on the durable agent, no rewind): the run
    begins on a conversation with its input twice, the model is asked anew and the refund runs again. Killed at
    the second record: the refund and the email are parallel calls, and at the first record the refund may not
    have run yet (which of them returns first is the threads' race)."""
    script = JOB.replace("await run_replay_safe(durable,", "await __import__('agents').Runner.run(durable,")
    killed = job(tmp_path, "tool.after_record:2", script)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert Effects(tmp_path / "effects.db").count("refund") == 1  # (it ran before the kill)
    again = job(tmp_path, None, script)
    assert again.returncode == 0, again.stderr[-2000:]
    assert Effects(tmp_path / "effects.db").count("refund") == 2


def test_a_session_cleared_since_the_run_began_is_refused(tmp_path: Path) -> None:
    from agents import SQLiteSession

    from examples.openai_agents_support.agent import OFFLINE, build_agent
    from tenxgraph.integrations.openai_agents import replay_safe, run_replay_safe
    from tenxgraph.storage.checkpointer import SqliteCheckpointer

    ledger, effects = SqliteCheckpointer(tmp_path / "ledger.db"), Effects(tmp_path / "effects.db")
    session = SQLiteSession("conv", str(tmp_path / "sessions.db"))
    asyncio.run(session.add_items([{"role": "user", "content": "hello"}]))

    def run(on: Any) -> Any:
        durable = replay_safe(build_agent(effects), ledger=ledger, run_id="job-2")
        return asyncio.run(run_replay_safe(durable, "refund A-1042", session=on, run_config=OFFLINE))

    run(session)
    asyncio.run(session.clear_session())
    with pytest.raises(ConfigError, match="began on session 'conv' with 1 items; session 'conv' holds 0"):
        run(session)
    other = SQLiteSession("other", str(tmp_path / "sessions.db"))
    with pytest.raises(ConfigError, match="it is another session"):
        run(other)
    assert effects.count("refund") == 1
