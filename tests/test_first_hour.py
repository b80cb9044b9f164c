"""What a new user hits in the first hour (#25): the command says its version, the options and markers say what
they take, and a mistake in one test is that test's own error."""

from __future__ import annotations

import subprocess
import sys

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
        [sys.executable, "-m", "tenxgraph.cli", "--version"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0 and out.stdout.strip() == f"tenxgraph {tenxgraph.__version__}", out


def test_serve_options_say_their_defaults() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tenxgraph.cli", "serve", "--help"], capture_output=True, text=True, check=True
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
