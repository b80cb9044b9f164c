"""The gate on MCP tools: the crash matrix over examples/mcp_tools (a real MCP server, its effects counted in its
own database) passes the integration, and fails each MCP mutant of tests/mutants.py for its own reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp.client.session", reason="the mcp extra is not installed: pip install '.[mcp]'")

from tests.mutants import MCP_MUTANTS

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "mcp_tools" / "test_mcp_tools.py"
#: What each mutant must be caught by: its failing cells' detail (the test's count of the server's rows).
CAUSES = {
    "mcp_hints_trusted_as_read": "open_ticket applied 2 times",
    "mcp_key_not_sent": "applied 0 times",
    "mcp_external_retried": "open_ticket applied 2 times",
}


def mcp_matrix(folder: Path, mutant: str | None) -> dict[str, Any]:
    folder.mkdir()
    (folder / "conftest.py").write_text(f"from tests.mutants import apply\n\napply({mutant!r})\n")
    (folder / "test_mcp_tools.py").write_text(EXAMPLE.read_text())
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-p", "no:xdist", "--crash-matrix"]
    command += ["--crash-backends=sqlite", "--crash-modes=inprocess"]  # (every point the test's marker names)
    command += ["--crash-seed=5", "--crash-report=r.json", "test_mcp_tools.py::test_mcp_tools_are_replay_safe"]
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    assert (folder / "r.json").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return {"exit": done.returncode, **json.loads((folder / "r.json").read_text())}


@pytest.mark.xdist_group("mcp-gate")
def test_the_matrix_passes_mcp_tools_and_catches_each_broken_integration(tmp_path: Path) -> None:
    assert set(CAUSES) == set(MCP_MUTANTS)
    names: list[str | None] = [None, *MCP_MUTANTS]
    with ThreadPoolExecutor(max_workers=2) as pool:
        found = pool.map(lambda m: mcp_matrix(tmp_path / (m or "control"), m), names)
        reports = dict(zip(names, found, strict=True))
    control = reports[None]
    failing = [c for c in control["cells"] if c["outcome"] in ("violation", "failed", "error", "resume_failed")]
    assert control["exit"] == 0 and not failing, [c["detail"][:200] for c in failing]
    assert {"tool.in_flight", "tool.after_return", "tool.after_record"} <= {c["point"] for c in control["cells"]}
    for mutant, cause in CAUSES.items():
        caught = [c for c in reports[mutant]["cells"] if c["outcome"] == "failed" and cause in c["detail"]]
        print(f"  {mutant:28} {len(caught):4} failed cells: {cause!r}")
        assert len(caught) > 1, (mutant, sorted({c["detail"][:200] for c in reports[mutant]["cells"]})[:5])
        assert reports[mutant]["exit"] != 0
