"""The crash matrix on a Pydantic AI agent must catch broken integrations, each for its own reason: the durable
example's matrix (examples/pydantic_ai_support, SQLite, in-process crashes) against each mutant below, run in a
pytest process of its own that the mutant patches, must put failing cells whose detail names the mutant's cause
in its JSON report; the integration as it is, none. (An unstable response key is caught by
tests/test_pydantic_ai_mutants.py: its matrix waits out lock timeouts.) The judge learns these facts on its own: the
tool's declaration and its body's return from the witness inside the body, the keys from the provider's effects."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai.durable_exec")

from tests.test_pydantic_ai_mutants import MUTANTS as RUN_MUTANTS
from tests.test_pydantic_ai_mutants import B

ROOT = Path(__file__).resolve().parents[1]
#: Each mutant: the code that breaks the integration, and what the cells that catch it must say. The first two are
#: tests/test_pydantic_ai_mutants.py's (its scenarios catch them by the effects and turns counted outside).
MUTANTS: dict[str, tuple[str, str]] = {
    # the model is asked again for a turn it answered: its calls come back with new ids, so new keys
    "model_not_journaled": (RUN_MUTANTS["model_not_journaled"][0], "different idempotency keys across attempts"),
    # the tools run outside the ledger: a finished call runs again, with no in-doubt detection
    "tools_not_through_ledger": (RUN_MUTANTS["tools_not_through_ledger"][0], "without in-doubt detection"),
    # the effect class and in-doubt policy the user declared are dropped (the witness reads the declaration)
    "declared_policy_dropped": (
        "import tenxgraph.integrations.pydantic_ai.durability as d\n"
        "from tenxgraph.integrations.pydantic_ai.backend import ToolPolicy\n"
        "d.LedgerDurability.policy_of = lambda self, name, meta: ToolPolicy(None, None, None)\n",
        "its tool declares effect external with in-doubt policy fail, yet the runtime handled",
    ),
    # a replayed call is answered with a value its body never returned
    "replay_wrong_result": (
        B + "_p = b._payload\n"
        "async def p(execution, raised):\n"
        "    out = await _p(execution, raised)\n"
        "    return {**out, 'result': 'E-999'} if execution.replayed and isinstance(out, dict) else out\n"
        "b._payload = p\n",
        "was answered with a value its body never returned",
    ),
    # the answers are not recorded: the refund runs on an approval the ledger never kept (the example's approved
    # refund, at the pause and after the refund's record)
    "decisions_not_recorded": (
        RUN_MUTANTS["decisions_not_recorded"][0],
        "ran although its approval was never recorded",
    ),
}
#: The cells a mutant's matrix runs, where not the durable agent's (-k durable).
SELECTS = {"decisions_not_recorded": ["-k", "approved_refund and not bare",
                                      "--crash-points=approval.after_pause,tool.after_record"]}  # fmt: skip


def run_matrix(workdir: Path, mutant: str | None) -> dict[str, object]:
    """The durable example's matrix in a pytest process the mutant patches (forked children inherit it)."""
    patch, cause = MUTANTS[mutant] if mutant else ("", "")
    report = workdir / f"{mutant or 'control'}.json"
    args = ["-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--crash-matrix", "--crash-backends=sqlite",
            "--crash-modes=inprocess", "--crash-seed=1", f"--crash-report={report}", "--crash-progress=off",
            *SELECTS.get(mutant or "", ["-k", "durable"]), str(ROOT / "examples" / "pydantic_ai_support")]  # fmt: skip
    code = f"{patch}import pytest, sys\nsys.exit(pytest.main({args!r}))\n"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    if not report.exists():
        raise AssertionError(f"{mutant}: no report\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    cells = json.loads(report.read_text())["cells"]
    failing = [c for c in cells if c["outcome"] in ("violation", "resume_failed", "error", "failed")]
    caught = [c for c in failing if c["outcome"] == "violation" and cause in c["detail"]]
    return {"mutant": mutant, "cells": len(cells), "failing": failing, "caught": caught, "exit": proc.returncode}


def test_every_pydantic_ai_mutant_is_caught_by_the_matrix_for_its_own_reason(tmp_path: Path) -> None:
    names: list[str | None] = [*MUTANTS, None]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda name: run_matrix(tmp_path, name), names))
    control, mutants = results[-1], results[:-1]
    print("\n" + "\n".join(f"  {r['mutant']:26} {len(r['caught']):3} cells of {r['cells']}" for r in mutants))  # type: ignore[arg-type]
    assert control["failing"] == [] and control["exit"] == 0 and control["cells"], control
    missed = {r["mutant"]: [c["detail"][:160] for c in r["failing"]][:3] for r in mutants if len(r["caught"]) < 2}  # type: ignore[arg-type]
    assert not missed, f"mutants the matrix did not catch for their own reason: {missed}"
    assert all(r["exit"] != 0 for r in mutants)  # and the gate goes red
