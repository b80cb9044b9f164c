"""The crash-point registry: declared points with locations, arming, hits, actions, env arming, kill -9."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pytest_replaysafe.run.effects  # noqa: F401 - declares tool.in_flight
from tenxgraph.core import crashpoints
from tenxgraph.core.crashpoints import CrashInjected, InjectedFault

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = {
    "run.before_node": "compiled.py",
    "tool.before_ledger_read": "invoke_node_handler.py",
    "tool.before_invoke": "invoke_node_handler.py",
    "tool.after_return": "invoke_node_handler.py",
    "tool.after_record": "invoke_node_handler.py",
    "node.after_complete": "compiled.py",
    "run.after_advance": "compiled.py",
}


def test_required_points_are_in_the_table_in_firing_order() -> None:
    points = {p.name: p for p in crashpoints.list_crash_points()}
    for name, module in REQUIRED.items():
        assert points[name].kind == "crash" and points[name].location.endswith("/" + module)
    faults = {p.name for p in crashpoints.list_crash_points(kind="fault")}
    assert faults == {"ledger.read_error", "ledger.write_error"}
    order = [p.name for p in crashpoints.POINTS]
    assert order.index("run.before_node") < order.index("tool.before_invoke") < order.index("tool.after_return")
    assert order.index("tool.after_return") < order.index("tool.after_record") < order.index("run.after_advance")


def probed(call: ast.Call) -> bool:
    """``probe.point("...")``: an integration's crash point (``tenxgraph.ledger.probe``)."""
    func = call.func
    return isinstance(func, ast.Attribute) and func.attr == "point" and getattr(func.value, "id", None) == "probe"


def test_every_call_site_is_in_the_module_the_table_names() -> None:
    """One table, checked against the source: each built-in point fires in exactly the module it names."""
    table = {p.name: set(p.locations) for p in crashpoints.POINTS}
    found: dict[str, set[str]] = {}
    for path in (ROOT / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and (getattr(node.func, "id", None) == "crash_point" or probed(node)):
                arg = node.args[0]
                assert isinstance(arg, ast.Constant), f"{path}: crash_point() needs a literal name"
                found.setdefault(arg.value, set()).add(path.relative_to(ROOT / "src").as_posix())
    assert set(found) == set(table)
    assert all(found[name] == locations for name, locations in table.items()), found


def test_arming_an_unknown_point_raises_naming_known_ones() -> None:
    with pytest.raises(KeyError, match=r"unknown crash point 'tool\.after_retrun'.*tool\.after_return"):
        crashpoints.arm("tool.after_retrun")
    with pytest.raises(ValueError, match="hit must be"):
        crashpoints.arm("tool.after_return", hit=0)
    with pytest.raises(ValueError, match="unknown crash action"):
        crashpoints.arm("tool.after_return", action="explode")  # type: ignore[arg-type]


def test_point_fires_on_its_nth_hit_only_once() -> None:
    seen: list[tuple[str, int]] = []
    crashpoints.arm("run.before_node", hit=3, action=lambda name, hit: seen.append((name, hit)))
    for _ in range(5):
        crashpoints.crash_point("run.before_node")
    assert seen == [("run.before_node", 3)]
    assert crashpoints.fired() == [("run.before_node", 3)]


def test_actions_raise_crash_or_fault() -> None:
    crashpoints.arm("tool.after_return")
    with pytest.raises(CrashInjected) as crash:
        try:
            crashpoints.crash_point("tool.after_return")
        except Exception:  # a crash is not an ordinary exception: application code cannot swallow it
            pytest.fail("CrashInjected was caught by 'except Exception'")
    assert (crash.value.point, crash.value.hit) == ("tool.after_return", 1)
    crashpoints.arm("ledger.write_error")  # fault points default to an ordinary exception
    with pytest.raises(InjectedFault):
        crashpoints.crash_point("ledger.write_error")


def test_counting_counts_only_inside_the_block() -> None:
    crashpoints.crash_point("run.before_node")  # disarmed and not counting: nothing happens
    with crashpoints.counting() as counts:
        crashpoints.crash_point("run.before_node")
        crashpoints.crash_point("run.before_node")
        crashpoints.crash_point("tool.after_return")
    crashpoints.crash_point("run.before_node")
    assert counts == {"run.before_node": 2, "tool.after_return": 1}
    assert crashpoints.fired() == []


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("tool.after_return", ("tool.after_return", 1, None)),
        ("run.before_node:3:raise", ("run.before_node", 3, "raise")),
    ],
)
def test_parse_crash_spec(spec: str, parsed: tuple[str, int, str | None]) -> None:
    assert crashpoints.parse_crash_spec(spec) == parsed


@pytest.mark.parametrize(
    ("spec", "message"), [("a:x", "not a whole number"), ("a:1:boom", "unknown action"), (":1", "expected name")]
)
def test_bad_crash_spec(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        crashpoints.parse_crash_spec(spec)


def run_child(
    tmp_path: Path, crash_at: str | None, backend: str = "sqlite", target: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), crashpoints.ENV_MARKER: str(tmp_path / "marker.json")}
    env.pop(crashpoints.ENV_CRASH_AT, None)
    if crash_at:
        env[crashpoints.ENV_CRASH_AT] = crash_at
    args = [backend, target or str(tmp_path / "state.db"), "thread-1", str(tmp_path / "effects.log")]
    return subprocess.run(
        [sys.executable, str(ROOT / "tests" / "support_child.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def effects(tmp_path: Path) -> list[str]:
    path = tmp_path / "effects.log"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize(
    ("crash_at", "expected_refunds"),
    [
        ("tool.after_record:2", 1),  # recorded, then killed: the resumed process replays it
        ("node.after_complete:4", 1),
        ("run.before_node:3", 1),
        ("tool.after_return:2", 2),  # documented gap: killed between return and record
    ],
)
def test_kill_9_child_then_resume_in_a_new_process(tmp_path: Path, crash_at: str, expected_refunds: int) -> None:
    killed = run_child(tmp_path, crash_at)
    assert killed.returncode == -9, killed.stderr
    point, hit = crash_at.split(":")
    assert crashpoints.read_marker(tmp_path / "marker.json") == (point, int(hit))
    resumed = run_child(tmp_path, None)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == "Refunded 20.00 EUR on order 1042."
    assert effects(tmp_path) == ["1042 20.0"] * expected_refunds


def test_env_arming_is_read_at_import(tmp_path: Path) -> None:
    code = (
        "import tenxgraph.core.crashpoints as c\n"
        "for arrival in range(1, 6):\n"
        "    try:\n"
        "        c.crash_point('tool.after_return')\n"
        "    except c.CrashInjected as crash:\n"
        "        print(arrival, crash.hit)\n"
    )
    env = {**os.environ, crashpoints.ENV_CRASH_AT: "tool.after_return:4:raise"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["4", "4"]  # armed at import: the 4th arrival raised, and only it


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("bogus", "unknown crash point 'bogus'; known points: approval.after_decision, approval.after_pause"),
        ("run.before_node:x", "hit 'x' is not a whole number"),
        ("run.before_node:1:explode", "unknown action 'explode'"),
    ],
)
def test_a_bad_crash_spec_in_the_environment_is_a_clear_error_at_import(spec: str, message: str) -> None:
    """Before: a raw KeyError at `import tenxgraph`."""
    env = {**os.environ, crashpoints.ENV_CRASH_AT: spec}
    proc = subprocess.run([sys.executable, "-c", "import tenxgraph"], env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("tenxgraph.errors.ConfigError: TENXGRAPH_CRASH_AT=") and message in last
    assert "unset TENXGRAPH_CRASH_AT to run without fault injection" in last


def test_the_harness_waits_on_descriptors_numbered_past_selects_limit() -> None:
    """A long matrix's process may hold more than 1024 descriptors; the harness's waits on its children's pipes
    use poll, which takes them (select raises ValueError for one)."""
    import select

    from pytest_replaysafe.run.procs import wait_readable

    read, write = os.pipe()
    high = 1500
    try:
        os.dup2(read, high)
        assert wait_readable([high], 0.01) == set()
        os.write(write, b"p")
        assert wait_readable([high], 1.0) == {high}
        with pytest.raises(ValueError):
            select.select([high], [], [], 0)
    finally:
        for fd in (read, write, high):
            os.close(fd)
