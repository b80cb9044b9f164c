"""Every Python code block of the README and docs/ runs.

```python blocks are executed as scripts; ```python test blocks are run as a pytest file with the plugin (with
the crash matrix on), and must pass. A block using DATABASE_URL gets the test PostgreSQL (and REDIS_URL).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```python( test)?\n(.*?)^```", re.S | re.M)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(kind: str) -> list[pytest.param]:  # type: ignore[valid-type]
    found = []
    for doc in DOCS:
        for i, match in enumerate(FENCE.finditer(doc.read_text())):
            if (match.group(1) == " test") == (kind == "test"):
                found.append(pytest.param(match.group(2), id=f"{doc.name}-{i + 1}"))
    return found


def test_the_docs_have_code() -> None:
    assert len(blocks("script")) >= 5 and len(blocks("test")) >= 3


@pytest.mark.parametrize("code", blocks("script"))
def test_script_block_runs(
    code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    if "DATABASE_URL" in code:
        monkeypatch.setenv("DATABASE_URL", request.getfixturevalue("pg_dsn"))
        monkeypatch.setenv("REDIS_URL", request.getfixturevalue("redis_url"))
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "<doc block>", "exec"), {"__name__": "__doc_block__"})


@pytest.mark.parametrize("code", blocks("test"))
def test_test_block_passes(code: str, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_doc_block=code)
    args = ["-p", "no:cacheprovider", "--crash-matrix", "-q"]
    if "def pytest_" in code:  # hooks only count in a conftest: the block says so
        pytester.makeconftest(code)
    elif "crash_matrix" in code:
        args.append("--crash-backends=memory,sqlite")
    result = pytester.runpytest_subprocess(*args)
    outcomes = result.parseoutcomes()
    assert result.ret == 0, result.stdout.str()
    assert outcomes.get("passed", 0) >= 1 and not outcomes.get("failed")
