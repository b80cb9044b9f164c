"""The harness must catch broken runtimes: the crash matrix over a small agent, against each mutant of
tests/mutants.py, must put at least one ``violation`` cell in its JSON report (a failing body assertion alone does
not count). The correct runtime, under the same matrix, must have none. The score is printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pytest_replaysafe import services
from tests.mutants import MUTANTS, NEEDS_DEPTH, NEEDS_DROP, NEEDS_ORDERS, NEEDS_OUTAGE, NEEDS_REDIS

ROOT = Path(__file__).resolve().parent.parent

AGENT_TEST = '''
import pytest
from tenxgraph import Message, ReactAgent, Reply, ScriptedModel, tool


def make_agent(checkpointer, effects):
    def refund_order(order_id: str, idempotency_key: str) -> str:
        """Refund an order (the provider honours the idempotency key)."""
        return effects.apply("refund", {"order": order_id}, idempotency_key)["effect_id"]

    async def send_email(to: str) -> str:
        """Send an email (no idempotency key: a re-run sends it again)."""
        return effects.apply("email", {"to": to})["effect_id"]

    @tool(on_in_doubt="fail")
    def open_ticket(title: str) -> str:
        """Open a ticket (never opened twice: a call in doubt is reported, not run again)."""
        return "ticket: " + title

    model = ScriptedModel([
        Reply(tool_calls=[("refund_order", {"order_id": "1042"}), ("send_email", {"to": "ada"})]),
        Reply(tool_calls=[("open_ticket", {"title": "refund 1042"})]),
        "Done.",
    ])
    return ReactAgent(model, tools=[refund_order, send_email, open_ticket]).compile(checkpointer=checkpointer)


@pytest.mark.crash_matrix
def test_agent(crash_run, effects):
    result = crash_run.invoke(make_agent(crash_run.checkpointer, effects), {"messages": [Message.text_message("go")]})
    assert result.final_text == "Done."
'''

CONFTEST = """
import os
from tests.mutants import apply

apply(os.environ.get("REPLAYSAFE_MUTANT"))
"""


def run_matrix(workdir: Path, mutant: str | None) -> dict[str, object]:
    """The matrix in a process of its own (a mutant patches the runtime process-wide)."""
    folder = workdir / (mutant or "control")
    folder.mkdir()
    (folder / "test_agent.py").write_text(AGENT_TEST)
    (folder / "conftest.py").write_text(CONFTEST)
    backends = "sqlite,postgres+redis" if mutant in NEEDS_REDIS else "sqlite"
    backends = "postgres" if mutant in NEEDS_DROP else backends
    fault, backends = NEEDS_OUTAGE.get(mutant or "", (None, backends))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REPLAYSAFE_MUTANT": mutant or ""}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-p",
            "no:xdist",
            "--crash-matrix",
            f"--crash-backends={backends}",
            *(["--crash-orders=all"] if mutant in NEEDS_ORDERS else []),
            *(["--crash-depth=2"] if mutant in NEEDS_DEPTH else []),
            *(["--crash-faults=drop", "--crash-modes=drop"] if mutant in NEEDS_DROP else []),
            *([f"--crash-faults={fault}", f"--crash-modes={fault}"] if fault else []),
            "--crash-seed=1",
            "--crash-report=report.json",
            "test_agent.py",
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = folder / "report.json"
    if not report.exists():
        raise AssertionError(f"{mutant}: no report\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    data = json.loads(report.read_text())
    violations = [c for c in data["cells"] if c["outcome"] == "violation"]
    return {"mutant": mutant, "summary": data["summary"], "violations": violations, "exit": proc.returncode}


def test_every_mutant_is_caught_with_violation_cells(tmp_path: Path) -> None:
    if not (os.environ.get(services.ENV_PG) and os.environ.get(services.ENV_REDIS)):
        if services.services_required():
            pytest.fail(f"{services.ENV_PG} and {services.ENV_REDIS} are needed for the Redis mutant")
        pytest.skip(f"set {services.ENV_PG} and {services.ENV_REDIS} (the Redis mutant needs them)")
    names: list[str | None] = [None, *MUTANTS]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda name: run_matrix(tmp_path, name), names))
    control, mutants = results[0], results[1:]
    lines = [f"  {r['mutant']:36} {len(r['violations']):4} violation cells" for r in mutants]  # type: ignore[arg-type]
    caught = [r for r in mutants if r["violations"]]
    print(f"\nmutation score: {len(caught)}/{len(mutants)} mutants caught with violation cells")
    print("\n".join(lines))
    assert control["violations"] == [] and control["exit"] == 0, control
    missed = [r["mutant"] for r in mutants if not r["violations"]]
    assert not missed, f"mutants the crash matrix did not catch: {missed}"
    assert all(r["exit"] != 0 for r in mutants)  # and the gate goes red
