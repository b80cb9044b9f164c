"""Broken Pydantic AI integrations must be caught, each for its own reason: each mutant below patches one step of
tenxgraph.integrations.pydantic_ai in the processes of a scenario (a crash and a resume, k resumers of a run, k
people approving one refund), and the scenario's facts, counted outside the runtime (the provider's effects and
keys, the model's turns, the answers), must show the mutant's own symptom; the integration as it is shows none.

(The crash matrix on Pydantic AI agents, with these as matrix mutants, is the next step of issue #53.)"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai.durable_exec")

ROOT = Path(__file__).resolve().parents[1]
B = "import tenxgraph.integrations.pydantic_ai.backend as b\n"

#: Each mutant: the code that breaks the integration, and the scenario that must catch it.
MUTANTS: dict[str, tuple[str, str]] = {
    # the model is asked again for a turn it has answered: new tool-call ids, new calls
    "model_not_journaled": (
        B + "async def j(self, body, context, key):\n    return await body()\nb.LedgerBackend._journaled = j\n",
        "crash",
    ),
    # the tools run outside the ledger: a finished call runs again, with no idempotency key
    "tools_not_through_ledger": (
        B + "async def t(self, body, params):\n    return await body()\nb.LedgerBackend._tool_call = t\n",
        "crash",
    ),
    # the call's key is not stable across processes: a resume does not find the record
    "response_key_unstable": (B + "import uuid\nb.response_id = lambda p: 'response:' + uuid.uuid4().hex\n", "crash"),
    # resumers of one run at once are not taken in turn
    "no_conversation_lock": (
        "import tenxgraph.integrations.pydantic_ai.durability as d\n"
        "from pydantic_ai.durable_exec import BaseDurabilityCapability as Base\n"
        "async def w(self, ctx, *, handler):\n    return await Base.wrap_run(self, ctx, handler=handler)\n"
        "d.LedgerDurability.wrap_run = w\n",
        "resumers",
    ),
    # the answers are not recorded: each approver runs the rest of the run anew
    "decisions_not_recorded": (
        "import tenxgraph.integrations.pydantic_ai.answering as a, uuid\n"
        "async def s(agent, results, history, run_id):\n    return run_id or str(uuid.uuid4())\n"
        "a._settle = s\n",
        "approvers",
    ),
}


#: For resumers "at once": each process, its imports done, waits at a barrier (a folder each one adds a file to)
#: until all k are there, and the model takes 0.3 s a turn (the scripted model answers in microseconds, so the
#: runs of processes started together would not overlap; a fixed start time was missed by a process still
#: importing on a loaded machine, and its run began after the others had finished).
AT_ONCE = """
import os, pathlib, time, pydantic_ai.models.function as f
import {agent}  # (imported before the barrier: the runs start together, not their imports)
_request = f.FunctionModel.request
async def slow(self, *args, **kwargs):
    import asyncio
    await asyncio.sleep(0.3)
    return await _request(self, *args, **kwargs)
f.FunctionModel.request = slow
_barrier = pathlib.Path({barrier!r})
(_barrier / str(os.getpid())).touch()
_until = time.time() + 60
while len(list(_barrier.iterdir())) < {k}:
    if time.time() > _until:
        raise SystemExit("the resumers' barrier: not all {k} processes arrived within 60 s")
    time.sleep(0.005)
"""


def launch(module: str, args: list[str], patch: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    code = f"{patch}\nimport runpy\nrunpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT)  # fmt: skip


def finish(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    outs = [p.communicate(timeout=120)[0] for p in procs]
    return [(p.returncode, out) for p, out in zip(procs, outs, strict=True)]


def effects(db: Path) -> list[tuple[str, str | None]]:
    with sqlite3.connect(db) as conn:
        return list(conn.execute("SELECT kind, idempotency_key FROM effects ORDER BY seq"))


def symptoms(scenario: str, tmp: Path, patch: str) -> set[str]:
    """What the scenario's outside facts show: each symptom a mutant is caught by."""
    db, ledger, agent = tmp / "effects.db", str(tmp / "ledger.db"), "examples.pydantic_ai_support.agent"
    found: set[str] = set()
    if scenario == "crash":  # crash after the email's effect, then one resume
        ((code, _),) = finish([launch(agent, [str(db), ledger, "r1", "email"], patch)])
        assert code == 9
        ((code, out),) = finish([launch(agent, [str(db), ledger, "r1"], patch)])
        assert code == 0, out
        if "asked the model 3 times" in out:
            found.add("the model was asked again for a turn it had answered")
        kinds = Counter(kind for kind, _ in effects(db))
        keys = {kind: {key for k, key in effects(db) if k == kind} for kind in kinds}
        if any(count > 1 for count in kinds.values()):
            found.add("an effect applied twice")
        if any(None in given for given in keys.values()):
            found.add("a tool was given no idempotency key")
        if any(len(given - {None}) > 1 for given in keys.values()):  # (each kind is one call of the run)
            found.add("one call was given two idempotency keys")
    elif scenario == "resumers":  # crash, then 4 processes resume the run at once
        finish([launch(agent, [str(db), ledger, "r1", "email"], patch)])
        barrier = tmp / "barrier"
        barrier.mkdir()
        together = patch + AT_ONCE.format(agent=agent, barrier=str(barrier), k=4)  # (the 4 runs overlap)
        outs = finish([launch(agent, [str(db), ledger, "r1"], together) for _ in range(4)])
        asked = sum(int(out.split("asked the model ")[1].split()[0]) for _, out in outs if "asked" in out)
        if asked > 2:
            found.add("more than one resumer asked the model")
    else:  # the refund waits for a person; 4 processes approve it at once
        approve, history = "examples.pydantic_ai_support.approve", str(tmp / "history.json")
        finish([launch(approve, [str(db), ledger, history, "ask"], patch)])
        finish([launch(approve, [str(db), ledger, history, "yes"], patch) for _ in range(4)])
        if Counter(kind for kind, _ in effects(db))["receipt"] > 1:
            found.add("each approver ran the rest of the run")
    return found


CAUGHT_BY = {
    "model_not_journaled": "the model was asked again for a turn it had answered",
    "tools_not_through_ledger": "a tool was given no idempotency key",
    "response_key_unstable": "one call was given two idempotency keys",
    "no_conversation_lock": "more than one resumer asked the model",
    "decisions_not_recorded": "each approver ran the rest of the run",
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_each_mutant_is_caught_for_its_own_reason(tmp_path: Path, mutant: str) -> None:
    patch, scenario = MUTANTS[mutant]
    assert CAUGHT_BY[mutant] in symptoms(scenario, tmp_path, patch)


@pytest.mark.parametrize("scenario", ["crash", "resumers", "approvers"])
def test_the_integration_as_it_is_shows_no_symptom(tmp_path: Path, scenario: str) -> None:
    assert symptoms(scenario, tmp_path, "") == set()
