"""pytest-replaysafe, tested the way users run it: pytester runs small suites with the plugin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_replaysafe.matrix.cells import LOCK_WINDOWS

pytest_plugins = ["pytester"]

AGENT = '''
import pytest
from tenxgraph import Message, ReactAgent, Reply, ScriptedModel, ToolCallBlock

def make_agent(checkpointer, effects=None, calls=None, **opts):
    def refund_order(order_id: str) -> str:
        """Refund an order."""
        if effects is not None:
            return effects.apply("refund", {"order": order_id})["effect_id"]
        return "refunded " + order_id
    script = calls or [Reply(tool_calls=[("refund_order", {"order_id": "1042"})]), "Refunded order 1042."]
    return ReactAgent(ScriptedModel(script), tools=[refund_order]).compile(checkpointer=checkpointer)

MSG = {"messages": [Message.text_message("refund order 1042")]}
'''


def write(pytester: pytest.Pytester, body: str, conftest: str = "") -> None:
    pytester.makepyfile(agent_helpers=AGENT)
    pytester.makepyfile(test_agent=body)
    if conftest:
        pytester.makeconftest(conftest)


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--crash-backends=memory,sqlite", *args)


def report(pytester: pytest.Pytester, result: pytest.RunResult) -> dict:  # type: ignore[type-arg]
    return json.loads((pytester.path / "matrix.json").read_text())


PROTECTED = """
import pytest
from agent_helpers import make_agent, MSG

@pytest.mark.crash_matrix(points=["tool.after_record", "run.before_node", "node.after_complete"])
def test_refund(crash_run):
    result = crash_run.invoke(make_agent(crash_run.checkpointer), MSG)
    assert result.final_text == "Refunded order 1042."
"""


def test_without_the_option_a_marked_test_runs_once(pytester: pytest.Pytester) -> None:
    write(pytester, PROTECTED)
    result = run(pytester, "-v")
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*crash matrix*")


def test_protected_tool_matrix_with_json_report(pytester: pytest.Pytester) -> None:
    write(pytester, PROTECTED)
    result = run(pytester, "--crash-matrix", "--crash-report=matrix.json", "--crash-seed=7", "-v")
    # 3 points x (memory: inprocess, stream + n/a sigkill; sqlite: inprocess, sigkill, stream) + sqlite's budgeted
    # cells: a contest at each of 9 lock windows, a recovery, a prune
    result.assert_outcomes(passed=26, skipped=3)
    result.stdout.fnmatch_lines(
        [
            "*test_refund?tool.after_record-sqlite-sigkill? PASSED*",
            "*replaysafe crash matrix (seed 7)*",
            "*tool.after_record*+*",
        ]
    )
    data = report(pytester, result)
    assert data["schema"] == "replaysafe.crash-matrix/1" and data["seed"] == 7
    after_record = [c for c in data["cells"] if c["point"] == "tool.after_record" and c["outcome"] != "not_applicable"]
    assert [c["mode"] for c in after_record if c["mode"] == "prune"] == ["prune"]  # the budgeted prune cell
    after_record = [c for c in after_record if c["mode"] != "prune"]
    assert {(c["backend"], c["mode"], c["hit"]) for c in after_record} == {
        ("memory", "inprocess", 1),
        ("memory", "stream", 1),
        ("sqlite", "inprocess", 1),
        ("sqlite", "sigkill", 1),
        ("sqlite", "stream", 1),
    }
    assert all(list(c["executions"].values()) == [1] for c in after_record)
    streamed = [c for c in data["cells"] if c["mode"] == "stream"]
    assert streamed and {c["outcome"] for c in streamed} == {"protected"}  # streaming is no longer a gap
    before_node = [c for c in data["cells"] if c["point"] == "run.before_node" and c["backend"] == "sqlite"]
    assert sorted({c["hit"] for c in before_node}) == [1, 2, 3]  # MAIN, TOOL, MAIN: one cell per hit
    assert data["summary"]["protected"] == 5 * (1 + 3 + 3) + 11 and data["summary"]["violation"] == 0  # hits/point
    contest = [c for c in data["cells"] if c["mode"] == "concurrent"]
    assert sorted((c["point"], c["backend"], c["hit"], c["outcome"]) for c in contest) == [
        ("run.before_node", "sqlite", 1, "protected")  # ledger_read_after_turn: crashed at the first node
    ] + 8 * [("run.before_node", "sqlite", 2, "protected")]
    assert sorted(c["coverage"]["window"] for c in contest) == sorted(LOCK_WINDOWS)  # one contest per lock window
    assert data["summary"]["not_applicable"] == 3
    cell = after_record[0]
    assert set(cell) == {
        "test",
        "point",
        "hit",
        "backend",
        "mode",
        "outcome",
        "gap",
        "executions",
        "duration_s",
        "repro",
    } | {"detail", "effects_applied", "gap_reasons", "timeline", "order", "then", "coverage", "not_applied"} | {
        "expected"
    }
    assert cell["then"] is None  # one crash (depth 1)
    assert "--crash-seed=7" in cell["repro"] and "--crash-hits=1" in cell["repro"]


def test_gaps_are_expected_outcomes_run_as_strict_xfail(pytester: pytest.Pytester) -> None:
    write(
        pytester,
        """
import pytest
from agent_helpers import make_agent, MSG

@pytest.mark.crash_matrix(points=["tool.after_return", "tool.in_flight", "ledger.write_error", "ledger.read_error"])
def test_refund(crash_run, effects):
    result = crash_run.invoke(make_agent(crash_run.checkpointer, effects), MSG)
    assert result.final_text == "Refunded order 1042."
""",
    )
    result = run(pytester, "--crash-matrix", "--crash-report=matrix.json", "-rx")
    result.assert_outcomes(xfailed=20, skipped=4, passed=11)  # 4 points x 5 columns; memory/sigkill n/a; budgeted
    result.stdout.fnmatch_lines(["*known gap after_return*", "*known gap in_flight*"])
    data = report(pytester, result)
    gaps = {(c["point"], c["gap"]) for c in data["cells"] if c["outcome"] == "known_gap"}
    assert gaps == {
        ("tool.after_return", "after_return"),
        ("tool.in_flight", "in_flight"),
        ("ledger.write_error", "failed_record_write"),
        ("ledger.read_error", "failed_ledger_read"),
    }
    assert data["summary"]["violation"] == 0


def test_a_gap_that_stops_duplicating_turns_red(pytester: pytest.Pytester) -> None:
    """An empty gap table entry for after_return... rather: a tool that cannot duplicate makes XPASS(strict)."""
    write(
        pytester,
        """
import pytest
from agent_helpers import make_agent, MSG

@pytest.mark.crash_matrix(points=["tool.after_return"], tools=["nothing_by_this_name"])
def test_refund(crash_run):
    crash_run.invoke(make_agent(crash_run.checkpointer), MSG)
""",
    )
    result = run(pytester, "--crash-matrix", "--crash-modes=inprocess")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*XPASS(strict)*known gap after_return was expected*update the gap table*"])
    # some hits only (make demo's first hits, a repro line) cannot show that a gap closed: nothing is claimed
    some = run(pytester, "--crash-matrix", "--crash-modes=inprocess", "--crash-hits=1")
    some.assert_outcomes(passed=2)
    some.stdout.no_fnmatch_line("*XPASS(strict)*")


SABOTAGE = '''
import pytest
from tenxgraph.storage.checkpointer import SqliteCheckpointer
from pytest_replaysafe.matrix.cells import Backend

class AmnesiacLedger(SqliteCheckpointer):
    """Records tool results but never finds them: a broken ledger."""
    async def aget_tool_results(self, thread_id, keys):
        return {}

def _factory(request):
    return AmnesiacLedger(request.getfixturevalue("tmp_path") / "broken.db")

def pytest_replaysafe_add_backends(config):
    return [Backend("amnesiac", _factory, durable=True)]
'''


def test_a_broken_ledger_is_reported_as_violations(pytester: pytest.Pytester) -> None:
    write(pytester, PROTECTED.replace('"run.before_node", ', ""), conftest=SABOTAGE)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--crash-matrix", "--crash-backends=amnesiac,sqlite", "--crash-report=matrix.json"
    )
    # 3 modes x 2 points + 11 budgeted cells, per backend: on the amnesiac one every crashed cell whose resume finds
    # a record fails (6), and so do the budgeted cells whose resume replays one: 4 takeovers by a contest, 1 prune
    result.assert_outcomes(passed=23, failed=11)
    result.stdout.fnmatch_lines(
        [
            "VIOLATION test_refund at * hit ?, amnesiac/*: refund_order ran 2 times",
            "*repro: pytest '*test_refund?tool.after_record-amnesiac-*' --crash-matrix --crash-seed=* --crash-hits=1*",
        ]
    )
    # ours, up to pytest's own short summary (which pytest leaves uncut when it runs on CI: $CI or $BUILD_NUMBER)
    section = result.stdout.str().split("replaysafe crash matrix", 1)[1].split("short test summary info")[0]
    section = section.splitlines()[1:-1]
    failures = [line for line in section if line.startswith("VIOLATION ")]
    assert len(failures) == 11  # one per failing cell (hit), never cut: the tool and its count are in it
    for line in section:
        assert len(line) <= 100 or line.startswith("    repro: pytest "), line
    for i, line in enumerate(section):
        if line.startswith("VIOLATION "):
            head = " ".join(section[i : i + 3])
            assert "refund_order(order_id='1042') executed 2 times" in head  # the whole reason follows
            assert next(s for s in section[i + 1 :] if not s.startswith("    ") or "repro:" in s).startswith(
                "    repro: pytest '"
            )
    assert any(line.startswith("NOT PROVED: 11 violation cells") for line in section)
    assert "cells]" not in result.stdout.str()  # progress is never glued to pytest's status words
    data = report(pytester, result)
    broken: dict[tuple[str, str], set[str]] = {}
    for c in data["cells"]:
        if c["backend"] == "amnesiac":
            broken.setdefault((c["point"], c["mode"]), set()).add(c["outcome"])
    assert len(broken) == 9, broken  # 3 modes x 2 points, the contests, the recovery, the prune
    assert all("violation" in outcomes for key, outcomes in broken.items() if key[1] != "recovery"), broken
    # hits with nothing to replay (the model node's crash before any tool ran) are rightly protected
    assert {c["hit"] for c in data["cells"] if c["outcome"] == "violation"} == {1, 2}
    assert {c["outcome"] for c in data["cells"] if c["backend"] == "sqlite"} == {"protected"}
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_a_point_the_test_never_reaches_is_vacuous_and_fails(pytester: pytest.Pytester) -> None:
    write(
        pytester,
        """
import pytest
from agent_helpers import make_agent, MSG

@pytest.mark.crash_matrix(points=["tool.after_record"], modes=["inprocess"])
def test_no_tools(crash_run):
    crash_run.invoke(make_agent(crash_run.checkpointer, calls=["no tool needed"]), MSG)
""",
    )
    result = run(pytester, "--crash-matrix", "--crash-report=matrix.json")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*VACUOUS*tool.after_record was never reached*"])
    assert {c["outcome"] for c in report(pytester, result)["cells"]} == {"vacuous"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--crash-points=tool.after_retrun"],
            "*unknown crash point 'tool.after_retrun'*known points:*tool.after_return*",
        ),
        (["--crash-backends=mongo"], "*unknown crash backend 'mongo'*known backends:*sqlite*"),
        (
            ["--crash-modes=sigterm"],
            "*unknown crash mode 'sigterm'*known modes: concurrent, double-resume, drop, inprocess, outage, prune, "
            "readonly, recovery, redis-down, resumers, sigkill, stream*",
        ),
        (["--crash-seed=abc"], "*--crash-seed='abc': give a whole number or 'last'*"),
    ],
)
def test_unknown_names_are_usage_errors(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    write(pytester, PROTECTED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--crash-matrix", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_unknown_point_in_the_marker_is_a_usage_error(pytester: pytest.Pytester) -> None:
    write(pytester, PROTECTED.replace("tool.after_record", "tool.after_recrod"))
    result = run(pytester, "--crash-matrix")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*unknown crash point 'tool.after_recrod' in @crash_matrix of*"])


def test_crash_list_prints_points_with_locations(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--crash-list")
    assert result.ret == 0
    result.stdout.fnmatch_lines(  # in the order the points fire in a run
        [
            "run.before_node*crash*tenxgraph/core/graph/compiled.py*the current node is recorded*",
            "ledger.read_error*fault*tenxgraph/core/graph/utils/invoke_node_handler.py*",
            "tool.in_flight*crash*pytest_replaysafe/run/effects.py*",
        ]
    )


def test_markers_are_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--markers")
    marker = "*@pytest.mark.crash_matrix(points=None, backends=None, modes=None, tools=None, depth=1, budget=8)*"
    result.stdout.fnmatch_lines([marker])


def test_seed_is_printed_and_last_reuses_it(pytester: pytest.Pytester) -> None:
    write(pytester, PROTECTED)
    first = pytester.runpytest_subprocess(
        "--crash-matrix", "--crash-backends=memory", "--crash-points=tool.after_record"
    )
    first.stdout.fnmatch_lines(["replaysafe: crash matrix on, seed * (repeat: --crash-seed=*"])
    seed = next(line for line in first.outlines if line.startswith("replaysafe:")).split("seed ")[1].split(" ")[0]
    again = pytester.runpytest_subprocess(
        "--crash-matrix", "--crash-backends=memory", "--crash-points=tool.after_record", "--crash-seed=last"
    )
    again.stdout.fnmatch_lines([f"replaysafe: crash matrix on, seed {seed} *"])


def test_markdown_summary_goes_to_github_step_summary(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(pytester, PROTECTED)
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    run(pytester, "--crash-matrix", "--crash-points=tool.after_record", "--crash-seed=3")
    text = summary.read_text()
    assert "### Crash matrix (seed 3)" in text and "| `tool.after_record` |" in text and "protected" in text


def test_junit_xml_gets_per_cell_properties(pytester: pytest.Pytester) -> None:
    write(pytester, PROTECTED)
    run(pytester, "--crash-matrix", "--crash-points=tool.after_record", "--junitxml=out.xml")
    xml = (pytester.path / "out.xml").read_text()
    assert 'name="replaysafe_cell"' in xml and "protected" in xml


def test_works_under_xdist(pytester: pytest.Pytester) -> None:
    write(pytester, PROTECTED)
    result = run(pytester, "--crash-matrix", "-n", "2", "--crash-report=matrix.json", "--crash-seed=11")
    result.assert_outcomes(passed=26, skipped=3)
    data = report(pytester, result)
    assert data["seed"] == 11 and data["summary"]["protected"] == 46  # cells came back from the workers


def test_user_suite_fixtures_and_faker_seeded_from_the_cell(pytester: pytest.Pytester) -> None:
    write(
        pytester,
        """
import pytest
from agent_helpers import make_agent, MSG

NAMES = []

@pytest.mark.crash_matrix(points=["tool.after_record"], modes=["inprocess"], backends=["sqlite"])
def test_refund(crash_run, faker):
    NAMES.append(faker.name())
    crash_run.invoke(make_agent(crash_run.checkpointer), MSG)
    print("FAKE", NAMES[-1])

def test_checkpointers(replaysafe_checkpointer):
    replaysafe_checkpointer.put_tool_result("t", "m:c", {"ok": 1})
    assert replaysafe_checkpointer.get_tool_results("t", ["m:c"]) == {"m:c": {"ok": 1}}
""",
    )
    a = run(pytester, "--crash-matrix", "--crash-seed=5", "-s", "-k", "test_refund")
    b = run(pytester, "--crash-matrix", "--crash-seed=5", "-s", "-k", "test_refund")
    c = run(pytester, "--crash-matrix", "--crash-seed=6", "-s", "-k", "test_refund")
    fake = [next(line.split("FAKE")[1] for line in r.outlines if "FAKE" in line) for r in (a, b, c)]
    assert fake[0] == fake[1] != fake[2]
    checkpointers = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "test_checkpointers", "-v")
    checkpointers.stdout.fnmatch_lines(["*test_checkpointers?memory? PASSED*", "*test_checkpointers?sqlite? PASSED*"])


IN_DOUBT = """
import pytest
from tenxgraph import Message, ReactAgent, Reply, ScriptedModel, tool

def build(checkpointer, effects, policy):
    def refund_order(order_id: str, idempotency_key: str) -> str:
        '''Refund an order.'''
        return effects.apply("refund", {"order": order_id}, idempotency_key)["effect_id"]

    reconcile = (lambda key, args: effects.lookup(key)) if policy == "reconcile" else None
    refund = tool(on_in_doubt=policy, reconcile=reconcile)(refund_order)
    model = ScriptedModel([Reply(tool_calls=[("refund_order", {"order_id": "1042"})]), "Refunded."])
    return ReactAgent(model, tools=[refund]).compile(checkpointer=checkpointer)

@pytest.mark.parametrize("policy", ["fail", "reconcile"])
@pytest.mark.crash_matrix(points=["tool.in_flight", "tool.after_return"])
def test_in_doubt(crash_run, effects, policy):
    result = crash_run.invoke(build(crash_run.checkpointer, effects, policy), {"messages": [Message.text_message("x")]})
    assert result.final_text == "Refunded."
    assert effects.count("refund", thread_id=crash_run.thread_id) == 1
"""


def test_in_doubt_tools_close_the_gaps_in_every_cell(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_agent=IN_DOUBT)
    result = run(pytester, "--crash-matrix", "--crash-report=matrix.json")
    result.assert_outcomes(passed=2 * 2 * 5 + 2 * 11, skipped=2 * 2)  # policies x points x 5 columns + budgeted
    budgeted = ("concurrent", "recovery", "prune")
    cells = [
        c for c in report(pytester, result)["cells"] if c["outcome"] != "not_applicable" and c["mode"] not in budgeted
    ]
    assert {c["outcome"] for c in cells} == {"in_doubt_handled"}
    assert all(max(c["executions"].values()) == 1 for c in cells)  # zero duplicate executions
    assert all(c["effects_applied"] == {"refund": 1} for c in cells)  # and one applied effect


LOCKLESS = """
import contextlib
from pytest_replaysafe.matrix.cells import Backend
from tenxgraph.storage.checkpointer import SqliteCheckpointer

class Lockless(SqliteCheckpointer):
    '''Lets every worker run a thread at once: the concurrent mode must catch it.'''
    @contextlib.asynccontextmanager
    async def arun_lock(self, thread_id):
        yield

def pytest_replaysafe_add_backends(config):
    return [Backend("lockless", lambda request: Lockless(request.getfixturevalue("tmp_path") / "l.db"))]
"""


def test_concurrent_mode_passes_with_the_run_lock_and_catches_its_absence(pytester: pytest.Pytester) -> None:
    write(pytester, PROTECTED.replace('"run.before_node", "node.after_complete"', '"run.before_node"'), LOCKLESS)
    ok = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--crash-matrix", "--crash-modes=concurrent", "--crash-backends=sqlite"
    )
    ok.assert_outcomes(passed=2)
    broken = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--crash-matrix", "--crash-modes=concurrent", "--crash-backends=lockless"
    )
    assert broken.ret == pytest.ExitCode.TESTS_FAILED
    broken.stdout.fnmatch_lines(["*VIOLATION*a second run entered the thread while another run held its run lock*"])


def test_help_lists_every_mode_and_the_service_variables(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--help")
    text = " ".join(result.stdout.str().split())
    assert "inprocess, sigkill, stream (the default" in text and "concurrent, recovery, prune" in text
    assert "REPLAYSAFE_PG_DSN" in text and "REPLAYSAFE_REDIS_URL" in text


def test_grid_rows_follow_firing_order_and_inapplicable_columns_are_left_out() -> None:
    from pytest_replaysafe.report import outputs as report

    def cell(point: str, backend: str, mode: str, outcome: str) -> dict[str, object]:
        return {"point": point, "backend": backend, "mode": mode, "outcome": outcome}

    cells = [
        cell(point, backend, mode, "not_applicable" if (backend, mode) == ("memory", "sigkill") else "protected")
        for point in ("run.after_advance", "tool.after_record", "run.before_node")
        for backend, mode in (("memory", "inprocess"), ("memory", "sigkill"), ("sqlite", "sigkill"))
    ]
    lines = report.text_grid(cells)
    rows = [line.split()[0] for line in lines[2:7]]
    assert rows == ["run", "run.before_node", "run.after_advance", "tool", "tool.after_record"]  # grouped
    assert lines[0].split() == ["memory", "sqlite"] and lines[1].split() == ["proc", "kill"]  # no memory/kill
    assert any(line.startswith("not applicable, left out: memory/sigkill") for line in lines)


SEEN = """
import json
import pytest
from agent_helpers import make_agent, MSG
from tenxgraph import Reply

CALLS = [Reply(tool_calls=[("refund_order", {"order_id": "1"}), ("refund_order", {"order_id": "2"})]), "done"]

@pytest.mark.crash_matrix(points=["tool.after_record"])
def test_refund(crash_run):
    crash_run.invoke(make_agent(crash_run.checkpointer, calls=list(CALLS)), MSG)
    seen = [crash_run.hit, crash_run.order, crash_run.cell.point, crash_run.cell.backend, crash_run.seed]
    with open("seen.jsonl", "a") as out:
        out.write(json.dumps(seen) + "\\n")
"""


def test_a_test_body_reads_the_hit_and_order_it_plays(pytester: pytest.Pytester) -> None:
    """``crash_run.hit``, ``.order``, ``.cell`` and ``.seed`` (public since the first release) say what each
    execution of the body plays: every hit of the point, with its completion orders, under the seed given."""
    write(pytester, SEEN)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--crash-matrix", "--crash-backends=memory", "--crash-modes=inprocess",
        "--crash-seed=7",
    )  # fmt: skip
    assert result.ret == 0 and "failed" not in result.parseoutcomes()  # (a known gap's cell is an xfail)
    seen = [json.loads(line) for line in (pytester.path / "seen.jsonl").read_text().splitlines()]
    assert {hit for hit, *_ in seen} == {1, 2}  # two records: the crash at the first, then at the second
    assert len({order for _, order, *_ in seen}) > 1  # two parallel calls: more than one completion order
    assert {(point, backend, seed) for _, _, point, backend, seed in seen} == {("tool.after_record", "memory", 7)}
