"""The gate on MCP tools: the crash matrix over examples/mcp_tools (a real MCP server, its effects counted in its
own database) passes the integration, and fails each MCP mutant of tests/mutants.py for its own reason."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("mcp.client.session", reason="the mcp extra is not installed: pip install '.[mcp]'")

from tests.helpers import ROOT, assert_each_caught, mutant_matrix, mutant_reports
from tests.mutants import MCP_MUTANTS

EXAMPLE = ROOT / "examples" / "mcp_tools" / "test_mcp_tools.py"
#: What each mutant must be caught by: the verdict's own finding (the witness saw the server's declaration and the
#: request it received), not the test's count of the server's rows.
CAUSES = {
    "mcp_hints_trusted_as_read": "yet the runtime handled the call as effect read",
    "mcp_key_not_sent": "reached its MCP server without the idempotency key the runtime reported",
    "mcp_external_retried": "yet the runtime handled the call as effect external with in-doubt policy retry",
}
#: Caught over an agent whose call fails on the server (FAILING): the witness read the server's own isError.
ERROR_CAUSES = {"mcp_error_taken_for_success": "was answered as a success although its body raised"}
FAILING = """
import pytest
from examples.mcp_tools.agent import ticket_server
from tenxgraph import Message, ReactAgent, Reply, ScriptedModel
from tenxgraph.integrations.mcp import mcp_tools


@pytest.mark.crash_matrix(backends=["sqlite"], modes=["inprocess"])
def test_a_call_the_server_refuses(crash_run, tmp_path):
    with ticket_server(tmp_path / "t.db") as desk:
        turn = [("get_ticket", {"ticket": 999}), ("open_ticket", {"title": "look into 999"})]
        model = ScriptedModel([Reply(tool_calls=turn), "done"])
        app = ReactAgent(model, tools=mcp_tools(desk)).compile(checkpointer=crash_run.checkpointer)
        result = crash_run.invoke(app, {"messages": [Message.text_message("go")]})
        assert result.final_text == "done"
"""


@pytest.mark.xdist_group("mcp-gate")
def test_the_matrix_passes_mcp_tools_and_catches_each_broken_integration(tmp_path: Path) -> None:
    assert set(CAUSES) | set(ERROR_CAUSES) == set(MCP_MUTANTS)
    options = ["--crash-backends=sqlite", "--crash-modes=inprocess", "--crash-seed=5", "--crash-hits=1"]
    options += ["-k", "test_mcp_tools_are_replay_safe"]  # the ticket desk's test (its rows are the count)
    reports = mutant_reports(tmp_path, [None, *CAUSES], EXAMPLE, lambda _: options)
    control = reports[None]
    failing = [c for c in control["cells"] if c["outcome"] in ("violation", "failed", "error", "resume_failed")]
    assert control["exit"] == 0 and not failing, [c["detail"][:200] for c in failing]
    assert {"tool.in_flight", "tool.after_return", "tool.after_record"} <= {c["point"] for c in control["cells"]}
    assert_each_caught(reports, CAUSES)


@pytest.mark.xdist_group("mcp-gate")
def test_a_server_error_answered_as_a_success_is_caught_by_the_witness(tmp_path: Path) -> None:
    test_file = tmp_path / "test_refused.py"
    test_file.write_text(FAILING)
    reports = mutant_reports(tmp_path, [None, *ERROR_CAUSES], test_file, lambda _: ["--crash-seed=5", "--crash-hits=1"])
    control = reports[None]
    assert control["exit"] == 0 and control["cells"], [c["detail"][:200] for c in control["cells"]]
    assert_each_caught(reports, ERROR_CAUSES, fails_the_run=False)


DYING = """
import pytest
from examples.mcp_tools.agent import ticket_server
from tenxgraph import Message, ReactAgent, Reply, ScriptedModel
from tenxgraph.integrations.mcp import mcp_tools


@pytest.mark.crash_matrix(points=["run.after_advance"], backends=["sqlite"], modes=["inprocess"])
def test_a_server_that_exits(crash_run, tmp_path):
    with ticket_server(tmp_path / "t.db") as desk:
        model = ScriptedModel([Reply(tool_calls=[("exit_server", {"code": 3})]), "done"])
        app = ReactAgent(model, tools=mcp_tools(desk)).compile(checkpointer=crash_run.checkpointer)
        crash_run.invoke(app, {"messages": [Message.text_message("go")]})
"""


def test_a_server_that_exits_mid_run_is_an_error_cell_naming_it(tmp_path: Path) -> None:
    test_file = tmp_path / "test_dying.py"
    test_file.write_text(DYING)
    started = time.monotonic()
    report = mutant_matrix(tmp_path / "run", None, test_file, ["--crash-seed=1"])
    assert time.monotonic() - started < 120 and report["exit"] != 0  # no hang; the gate is red
    (cell,) = report["cells"]
    assert cell["outcome"] == "error" and "MCP server 'tickets'" in cell["detail"]
    assert "went away during the call to 'exit_server'" in cell["detail"]
