"""The suite's ``xdist_group`` marks hold: ``make test`` runs ``--dist loadgroup``, and a group's tests share one
worker, which builds the group's expensive fixtures (the LangGraph and shard matrices) once. pytest 9.2 with xdist
3.8 silently spread a group's tests over every worker (pytest-xdist#1386): each built the matrices again, and
``make test`` took minutes longer. When this fails after an upgrade, pin the pair that keeps groups together."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

GROUPED = """
import os
import pytest

pytestmark = pytest.mark.xdist_group("one")


@pytest.fixture(scope="module")
def built():
    with open("builds.txt", "a") as out:
        out.write(os.environ.get("PYTEST_XDIST_WORKER", "-") + "\\n")


@pytest.mark.parametrize("i", range(6))
def test_grouped(built, i):
    pass
"""


def test_a_groups_tests_run_on_one_worker_that_builds_its_fixture_once(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_grouped=GROUPED)
    pytester.makepyfile(**{f"test_other_{k}": "def test_other():\n    pass\n" for k in range(4)})
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "3", "--dist", "loadgroup", "-v")
    result.assert_outcomes(passed=10)
    workers = {line.split()[0] for line in result.outlines if "test_grouped[" in line and "PASSED" in line}
    assert len(workers) == 1, f"one group ran on {sorted(workers)}: --dist loadgroup no longer groups"
    assert (pytester.path / "builds.txt").read_text().split() == [workers.pop().strip("[]")]
