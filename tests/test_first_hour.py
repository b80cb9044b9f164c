"""What a new user hits in the first hour (#25): the command says its version, the options and markers say what
they take, and a mistake in one test is that test's own error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tenxgraph
from tests.test_plugin import write

pytest_plugins = ["pytester"]

MISUSED = """
import pytest
from agent_helpers import make_agent, MSG

@pytest.mark.crash_matrix
def test_forgot_crash_run():
    assert make_agent(None).invoke(MSG, {"thread_id": "t"}).final_text

def test_unrelated():
    assert True
"""


def test_the_command_says_its_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tenxgraph.server.cli", "--version"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0 and out.stdout.strip() == f"tenxgraph {tenxgraph.__version__}", out


def test_serve_options_say_their_defaults() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tenxgraph.server.cli", "serve", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "default 127.0.0.1" in out and "default 8000" in out


def test_a_marked_test_without_crash_run_is_its_own_error(pytester: pytest.Pytester) -> None:
    write(pytester, MISUSED)
    for args in ((), ("--crash-matrix",)):
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
        result.assert_outcomes(passed=1, errors=1)  # the file's other test runs
        result.stdout.fnmatch_lines(["*test_forgot_crash_run is marked crash_matrix but does not use the crash_run*"])
        assert "Traceback" not in result.stdout.str() and "_hooks.py" not in result.stdout.str()


def test_the_marker_and_the_modes_option_say_what_they_take(pytester: pytest.Pytester) -> None:
    markers = pytester.runpytest_subprocess("--markers").stdout.str()
    assert "depth=1, budget=8" in markers and "@pytest.mark.crash_matrix" in markers
    help_text = " ".join(pytester.runpytest_subprocess("--help").stdout.str().split())
    for mode in ("concurrent", "recovery", "prune", "drop", "outage", "redis-down", "readonly"):
        assert mode in help_text.split("--crash-modes=")[1].split("--crash-hits")[0], mode


def test_a_mistyped_marker_fails_under_strict_markers(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_typo="import pytest\n\n@pytest.mark.crashmatrix\ndef test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--strict-markers")
    result.stdout.fnmatch_lines(["*'crashmatrix' not found in `markers` configuration option*"])
    assert result.ret != 0


OWN_EFFECT = """
import pytest
from tenxgraph import Message, ReactAgent, Reply, ScriptedModel
from tenxgraph.core.crashpoints import crash_point

CHARGES = []

def make_agent(checkpointer, fire):
    def charge(amount: float) -> str:
        \"\"\"Charge a card.\"\"\"
        CHARGES.append(amount)  # the effect, done
        if fire:
            crash_point("tool.in_flight")  # ... and the process may die before the tool returns
        return "charged"

    model = ScriptedModel([Reply(tool_calls=[("charge", {"amount": 5.0})]), "Charged."])
    return ReactAgent(model, tools=[charge]).compile(checkpointer=checkpointer)

@pytest.mark.crash_matrix(points=["tool.in_flight"], backends=["sqlite"], modes=["inprocess"])
@pytest.mark.parametrize("fire", [False, True])
def test_charge(crash_run, fire):
    result = crash_run.invoke(make_agent(crash_run.checkpointer, fire), {"messages": [Message.text_message("go")]})
    assert result.final_text == "Charged."
"""


def test_the_in_flight_window_of_a_users_own_tool(pytester: pytest.Pytester) -> None:
    """Without the effects fixture, tool.in_flight is vacuous and says what makes it reachable; a tool that fires
    it after its own effect gets the in-flight gap cells."""
    pytester.makepyfile(test_own=OWN_EFFECT)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--crash-matrix", "--crash-report=r.json")
    result.assert_outcomes(failed=1, xfailed=1)
    cells = json.loads((pytester.path / "r.json").read_text())["cells"]
    vacuous = [c for c in cells if c["outcome"] == "vacuous"]
    assert len(vacuous) == 1 and "[tool.in_flight-sqlite-inprocess-False]" in vacuous[0]["test"]
    assert "effects.apply(" in vacuous[0]["detail"] and "crash_point('tool.in_flight')" in vacuous[0]["detail"]
    assert [c["gap"] for c in cells if "True" in c["test"]] == ["in_flight"]


def test_a_tool_argument_json_cannot_hold_names_the_tool_and_the_argument() -> None:
    import datetime

    from tenxgraph import Message, ReactAgent, Reply, ScriptedModel
    from tenxgraph.errors import SerializationError

    def refund(order_id: str, when: str) -> str:
        """Refund."""
        return "ok"

    when = datetime.datetime(2026, 1, 2)
    model = ScriptedModel([Reply(tool_calls=[("refund", {"order_id": "1", "when": when})]), "ok"])
    with pytest.raises(SerializationError) as caught:
        ReactAgent(model, tools=[refund]).compile().invoke(
            {"messages": [Message.text_message("x")]}, {"thread_id": "t"}
        )
    assert "tool call 'refund' (id 'call_1') has argument 'when'" in str(caught.value)
    assert "a datetime" in str(caught.value) and "ISO string" in str(caught.value)


def test_a_refused_connection_says_so_on_one_line() -> None:
    from tenxgraph.errors import StorageConnectionError
    from tenxgraph.storage.checkpointer import PgCheckpointer

    cp = PgCheckpointer(postgres_dsn="postgresql://postgres@127.0.0.1:1/none", connect_timeout=1, retries=0)
    with pytest.raises(StorageConnectionError) as caught:
        cp.get_thread("t")
    text = str(caught.value)
    assert "Connection refused" in text and "\t" not in text and "\n" not in text and "in 1 attempt " in text


def test_closing_lines_count_alike_and_in_good_english() -> None:
    from pytest_replaysafe.report.outputs import closing_lines

    def cell(outcome: str) -> dict[str, str]:
        return {"outcome": outcome, "backend": "sqlite"}

    one = closing_lines([cell("protected")])
    assert one[0].startswith("proved: 1 cell held on sqlite: ") and "1 cells" not in " ".join(one)
    assert closing_lines([cell("known_gap")], xfailed=1)[:2] == [
        "proved: nothing: no cell held (every cell was a known gap or not applicable)",
        "known gaps: 1 cell (1 xfailed test) re-ran a call where documented: docs/replay-safe-tools.md",
    ]
    assert closing_lines([cell("failed")])[0].startswith("NOT PROVED: 1 failed cell (")
    held = [cell("protected"), cell("in_doubt_handled"), cell("exactly_once")]
    assert closing_lines(held)[0].startswith("proved: 3 cells")  # the HTML headline counts the same three
    from pytest_replaysafe.report import html

    assert (
        "s.protected + s.in_doubt_handled + s.exactly_once" in (Path(html.__file__).parent / "report.html").read_text()
    )


def _crash_refund_then(tmp_path: Path, resume: Any) -> tuple[Any, list[str]]:
    from tenxgraph import Message, ReactAgent, Reply, ScriptedModel
    from tenxgraph.core import crashpoints
    from tenxgraph.storage.checkpointer import SqliteCheckpointer

    charged: list[str] = []

    def charge(order_id: str) -> str:
        """Charge."""
        charged.append(order_id)
        return "charged"

    def build(cp: Any) -> Any:
        model = ScriptedModel([Reply(tool_calls=[("charge", {"order_id": "1042"})]), "Charged."])
        return ReactAgent(model, tools=[charge]).compile(checkpointer=cp)

    cp = SqliteCheckpointer(tmp_path / "state.db")
    with crashpoints.armed("tool.after_return"), pytest.raises(crashpoints.CrashInjected):
        build(cp).invoke({"messages": [Message.text_message("go")]}, {"thread_id": "t"})
    try:
        return resume(build(cp)), charged
    finally:
        cp.close()


def test_a_resume_that_runs_calls_again_warns_naming_them(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    with caplog.at_level(logging.INFO, logger="tenxgraph"):
        result, charged = _crash_refund_then(tmp_path, lambda app: app.invoke(None, {"thread_id": "t"}))
    assert result.final_text == "Charged." and charged == ["1042", "1042"]  # the after-return gap
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "calls_run_on_resume" in r.getMessage()]
    assert len(warned) == 1 and "charge (" in warned[0].getMessage() and ":call_1)" in warned[0].getMessage()


def test_a_recovered_run_is_counted_and_timed_in_the_metrics(tmp_path: Path) -> None:
    pytest.importorskip("starlette")
    from tenxgraph.server.metrics import Metrics
    from tenxgraph.server.recovery import Recovery
    from tenxgraph.utils.sync import run_sync

    metrics = Metrics()
    metrics.start()
    try:
        outcome, _ = _crash_refund_then(tmp_path, lambda app: run_sync(Recovery(app).recover("t")))
    finally:
        metrics.stop()
    text = metrics.render()
    assert outcome == "recovered"
    assert 'tenxgraph_runs_total{outcome="finished"} 1' in text and "tenxgraph_run_seconds_count 1" in text
    assert 'tenxgraph_recoveries_total{outcome="recovered"} 1' in text


def test_skips_are_summarised_one_line_per_reason(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("from tests.conftest import pytest_terminal_summary  # noqa: F401\n")
    pytester.makepyfile(
        test_skips="""
import pytest

@pytest.mark.parametrize("n", range(3))
def test_needs_pg(n):
    pytest.skip("PostgreSQL is not available")

def test_needs_redis():
    pytest.skip("Redis is not available")
"""
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-rfEX")
    result.assert_outcomes(skipped=4)
    result.stdout.fnmatch_lines(
        ["*skipped, by reason*", "   3 PostgreSQL is not available", "   1 Redis is not available"]
    )
    assert "SKIPPED [" not in result.stdout.str()


USERS_OWN_ASSERTION = """
import sqlite3
import pytest
from tenxgraph import Message, ReactAgent, Reply, ScriptedModel, ToolContext

def make_agent(checkpointer, db, checks_state):
    def charge(amount: float, call: ToolContext) -> str:
        \"\"\"Charge the customer's card.\"\"\"
        thread = call.thread_id  # one customer per thread: the clean run and each hit have their own
        with sqlite3.connect(db) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS charges (thread TEXT, amount REAL)")
            done = conn.execute("SELECT count(*) FROM charges WHERE thread = ?", (thread,)).fetchone()[0]
            if done and checks_state:
                raise ValueError("card already charged")  # a tool that checks state refuses its second run
            conn.execute("INSERT INTO charges VALUES (?, ?)", (thread, amount))
        return "charged"

    model = ScriptedModel([Reply(tool_calls=[("charge", {"amount": 5.0})]), "Charged."])
    return ReactAgent(model, tools=[charge]).compile(checkpointer=checkpointer)

def charges(db, thread):
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count(*) FROM charges WHERE thread = ?", (thread,)).fetchone()[0]

MATRIX = pytest.mark.crash_matrix(
    points=["run.before_node", "tool.after_return"], backends=["sqlite"], modes=["inprocess", "sigkill"]
)

@MATRIX
def test_charged_once(crash_run, replaysafe_workdir):
    db = str(replaysafe_workdir / "shop.db")
    crash_run.invoke(make_agent(crash_run.checkpointer, db, False), {"messages": [Message.text_message("go")]})
    n = charges(db, crash_run.thread_id)
    assert n == EXPECTED, f"customer charged {n} times"

@MATRIX
def test_told_it_was_charged(crash_run, replaysafe_workdir):
    db = str(replaysafe_workdir / "shop.db")
    result = crash_run.invoke(make_agent(crash_run.checkpointer, db, True), {"messages": [Message.text_message("go")]})
    assert charges(db, crash_run.thread_id) == 1
    answer = result.messages[2].tool_results[0]
    assert not answer.is_error and answer.output == "charged", answer.output
"""


def test_a_users_assertion_failing_at_a_known_gap_names_the_gap_the_call_and_the_remedy(
    pytester: pytest.Pytester,
) -> None:
    """#25 item 2: the test's own assertion fails where a documented gap re-ran a call; the failure says which gap,
    which call, what closes it, and where the docs are, and the footer counts such cells apart."""
    pytester.makepyfile(test_users=USERS_OWN_ASSERTION.replace("EXPECTED", "1"))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--crash-matrix", "--crash-report=r.json", "--crash-html=r.html"
    )
    out = result.stdout.str()
    result.assert_outcomes(failed=4, passed=4)  # after_return fails in both modes, before_node holds
    data = json.loads((pytester.path / "r.json").read_text())
    at_gap = [c for c in data["cells"] if c["outcome"] == "failed"]
    assert len(at_gap) == 4 and all(c["gap"] == "after_return" and c["point"] == "tool.after_return" for c in at_gap)
    assert data["failed_at_known_gap"] == 4 and '"failed_at_known_gap":4' in (pytester.path / "r.html").read_text()
    for cell in at_gap:
        detail = cell["detail"]
        assert (
            "AssertionError: customer charged 2 times" in detail or "AssertionError: ValueError: card already" in detail
        )
        reason = cell["gap_reasons"]["after_return"]
        assert f"failed at known gap after_return (tool.after_return hit 1: {reason}): " in detail, detail
        assert "ran again where the gap table expects it (after_return): charge(amount=5.0)" in detail
        assert (
            'effect="transactional"' in detail and "idempotency_key" in detail and 'on_in_doubt="reconcile"' in detail
        )
        assert "docs/replay-safe-tools.md#what-it-does-not-guarantee" in detail
    refused = [c["detail"] for c in at_gap if "test_told_it_was_charged" in c["test"]]
    assert len(refused) == 2 and all(
        "its runs answered differently: first 'charged', then the error 'ValueError: card already charged'" in d
        for d in refused
    )
    # pytest's own failure report (the exception's notes) says the same, and the terminal's failure line leads with it
    assert out.count("E       replaysafe: the test failed at known gap after_return") == 4
    result.stdout.fnmatch_lines(
        ["FAILED test_charged_once at tool.after_return hit 1, sqlite/*: at known gap after_return"]
    )
    footer = " ".join(out.rsplit("NOT PROVED", 1)[1].split("reports: ")[0].split())
    assert (
        "failed at a known gap: 4 cells" in footer and "docs/replay-safe-tools.md#what-it-does-not-guarantee" in footer
    )


def test_a_failure_away_from_any_gap_names_no_gap(pytester: pytest.Pytester) -> None:
    """The other direction: an assertion that fails where no call ran again is a plain failure, counted as one."""
    pytester.makepyfile(test_users=USERS_OWN_ASSERTION.replace("EXPECTED", "3"))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--crash-matrix", "--crash-report=r.json", "-k", "before_node and charged_once"
    )
    result.assert_outcomes(failed=2)
    data = json.loads((pytester.path / "r.json").read_text())
    assert data["failed_at_known_gap"] == 0 and all(c["gap"] is None for c in data["cells"])
    assert "known gap" not in " ".join(c["detail"] for c in data["cells"])
    assert "failed at a known gap" not in result.stdout.str()


EXTERNAL_EMAIL = """
import pytest
from tenxgraph import Message, ReactAgent, Reply, ScriptedModel, tool

def build(checkpointer, effects):
    @tool(effect="external")
    def send_email(to: str, idempotency_key: str) -> str:
        \"\"\"Email a customer.\"\"\"
        return effects.apply("email", {"to": to}, idempotency_key)["effect_id"]

    model = ScriptedModel([Reply(tool_calls=[("send_email", {"to": "ann@example.com"})]), "Emailed."])
    return ReactAgent(model, tools=[send_email]).compile(checkpointer=checkpointer)

@pytest.mark.crash_matrix(points=["tool.before_invoke", "tool.in_flight"], backends=["sqlite"], modes=["inprocess"])
def test_email(crash_run, effects):
    result = crash_run.invoke(build(crash_run.checkpointer, effects), {"messages": [Message.text_message("x")]})
    assert result.final_text == "Emailed."
"""


def test_an_external_call_settled_in_doubt_says_whether_anything_was_sent(pytester: pytest.Pytester) -> None:
    """#25 item 8: a `d` cell where the email was never sent says so (and that the final answer claims it), apart
    from one where it was sent once; the terminal says it in a footnote."""
    pytester.makepyfile(test_ext=EXTERNAL_EMAIL)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--crash-matrix", "--crash-report=r.json")
    result.assert_outcomes(passed=2)
    cells = {c["point"]: c for c in json.loads((pytester.path / "r.json").read_text())["cells"]}
    unsent, sent = cells["tool.before_invoke"], cells["tool.in_flight"]
    assert unsent["outcome"] == sent["outcome"] == "in_doubt_handled"
    label = "send_email(to='ann@example.com')"
    assert f"{label} (on_in_doubt='fail'): its body had not started, so nothing was applied" in unsent["detail"]
    assert "the model was shown an error \"tool 'send_email' is in doubt" in unsent["detail"]
    assert "the final answer was 'Emailed.' all the same" in unsent["detail"]
    assert unsent["not_applied"] == [label] and unsent["effects_applied"] == {}
    assert "its body had run once, and its effect was applied 1 time" in sent["detail"]
    assert (
        "all the same" not in sent["detail"] and sent["not_applied"] == [] and sent["effects_applied"] == {"email": 1}
    )
    text = " ".join(result.stdout.str().split())
    assert "d at tool.before_invoke: in 1 cell send_email was not run again and had not taken effect" in text
    assert "d at tool.in_flight" not in text
