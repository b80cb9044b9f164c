"""Before each resume on postgres+redis the cache is left stale, holding a future state, or flushed (chosen by the
hit's seeded thread): a correct resume reads PostgreSQL in all three; one that trusts the cache is caught in the
stale and future cells, and a flushed cache lets it through (which is why there are three)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

from pytest_replaysafe.matrix import services

ROOT = Path(__file__).resolve().parents[1]


def run(folder: Path, mutant: str | None, pg_dsn: str, redis_url: str) -> list[dict[str, object]]:
    folder.mkdir()
    (folder / "conftest.py").write_text(f"from tests.mutants import apply\n\napply({mutant!r})\n")
    (folder / "test_refund.py").write_text((ROOT / "examples/support_refund/test_support_refund.py").read_text())
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
        "PYTHONPATH": str(ROOT),
        services.ENV_PG: pg_dsn,
        services.ENV_REDIS: redis_url,
    }
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-p", "no:xdist", "--crash-matrix"]
    command += ["--crash-backends=postgres+redis", "--crash-modes=inprocess", "--crash-seed=3", "--crash-report=r.json"]
    subprocess.run([*command, "test_refund.py"], cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    return json.loads((folder / "r.json").read_text())["cells"]  # type: ignore[no-any-return]


def fault_of(cell: dict[str, object]) -> str | None:
    timeline = cell["timeline"]
    assert isinstance(timeline, list)
    texts = [e["text"] for e in timeline if e["kind"] == "fault"]
    return texts[0].split(" left ")[1].split(" ")[0] if texts else None


def test_stale_future_and_flushed_caches_before_the_resume(tmp_path: Path, pg_dsn: str, redis_url: str) -> None:
    control = run(tmp_path / "control", None, pg_dsn, redis_url)
    assert {fault_of(c) for c in control} >= {"stale", "future", "flushed"}
    assert not [c for c in control if c["outcome"] == "violation"]
    trusting = run(tmp_path / "mutant", "stale_redis_trusted", pg_dsn, redis_url)
    caught = collections.Counter(fault_of(c) for c in trusting if c["outcome"] in ("violation", "resume_failed"))
    assert caught["future"] and caught["stale"] and not caught["flushed"], caught
