"""What a person sees of the matrix: the grid within 100 columns, progress in cells, failure lines, the three
closing lines, and the HTML report rendered in a real headless browser."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_replaysafe.report import outputs as report
from pytest_replaysafe.report.progress import Progress
from tenxgraph.core.crashpoints import POINTS

sys.path.insert(0, str(Path(__file__).parent))
import browser

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("memory", "sqlite", "postgres", "postgres+redis", "my-own-backend")
MODES = ("inprocess", "sigkill", "stream", "concurrent")


def synthetic(backends: tuple[str, ...], outcomes: tuple[str, ...]) -> list[dict[str, object]]:
    """Every point x backend x mode, each square holding every outcome in *outcomes* (10+ of some: wide squares)."""
    cells: list[dict[str, object]] = []
    for point in [p.name for p in POINTS]:
        for backend in backends:
            for mode in MODES:
                if (backend, mode) == ("memory", "sigkill"):
                    cells.append({"point": point, "backend": backend, "mode": mode, "outcome": "not_applicable"})
                    continue
                for i, outcome in enumerate(outcomes):
                    for _ in range(12 if i == len(outcomes) - 1 else 3):
                        cells.append({"point": point, "backend": backend, "mode": mode, "outcome": outcome})
    return cells


@pytest.mark.parametrize("backends", [BACKENDS[:2], BACKENDS[:4], BACKENDS])
@pytest.mark.parametrize(
    "outcomes", [("protected",), ("known_gap", "protected"), ("violation", "known_gap", "protected")]
)
def test_the_grid_fits_100_columns_and_wraps_backends_into_panels(
    backends: tuple[str, ...], outcomes: tuple[str, ...]
) -> None:
    lines = report.text_grid(synthetic(backends, outcomes))
    assert max(len(line) for line in lines) <= 100, "\n".join(lines)
    headers = [line.split() for i, line in enumerate(lines) if i == 0 or (lines[i - 1] == "" and line)]
    shown = [b for header in headers for b in header]
    assert shown == list(backends)  # every backend once, in the usual order, in as many panels as needed
    if backends == BACKENDS[:2] and len(outcomes) < 3:
        assert len(headers) == 1  # the default backends fit one panel
    points = [line.split()[0] for line in lines if line.startswith("  ") and "." in line.split()[0]]
    assert points[:3] == ["run.before_node", "node.after_complete", "run.after_advance"]
    assert points[-2:] == ["ledger.read_error", "ledger.write_error"]


def test_progress_counts_cells_and_estimates_the_rest() -> None:
    now = [0.0]
    progress = Progress(every=5.0, clock=lambda: now[0])
    items = [f"t.py::test_a[{p}-sqlite-{m}]" for p in ("run.before_node", "tool.after_record") for m in MODES[:2]]
    progress.expect(items)
    now[0] = 2.0
    assert progress.finished(items[0], [{}] * 14) is None  # not due before 5 s
    now[0] = 6.0
    line = progress.finished(items[2], [{}] * 7)
    # same test and point as a finished item: 14 and 7 hits; 21 of ~42 done in 6 s -> about 6 s left
    assert line == "replaysafe: 21/~42 cells, 2/4 tests, 6 s, about 6 s left"
    now[0] = 7.0
    assert progress.finished(items[1], [{}] * 14) is None  # 5 s have not passed since the last line
    assert progress.finished(items[3], [{}] * 7) is None  # the last item: the grid follows
    assert progress.estimate_total() == (42, True)
    assert Progress(every=None).finished(items[0], []) is None


def run_examples(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    # two examples: a sequential and a parallel agent (every example's matrix runs in `make demo`; the LangGraph
    # example's closing lines are checked in tests/test_langgraph.py)
    command = [sys.executable, "-m", "pytest", "examples/support_refund", "examples/parallel_tools"]
    command += ["-p", "no:cacheprovider", "-rfE", "--crash-matrix"]
    command += ["--crash-backends=memory,sqlite", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.xdist_group("examples")
def test_the_example_matrix_reads_in_100_columns_and_its_html_report_renders(tmp_path: Path) -> None:
    html, data = tmp_path / "m.html", tmp_path / "m.json"
    done = run_examples(tmp_path, "-n", "2", "--crash-progress=0", f"--crash-html={html}", f"--crash-report={data}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout.splitlines()
    # (pytest's own header lists the installed plugins: not ours to wrap)
    assert [line for line in out if len(line) > 100 and not line.startswith("plugins: ")] == []
    progress = [line for line in out if "replaysafe: " in line and " cells, " in line]
    assert len(progress) >= 10 and "left" in progress[0]  # xdist: the controller counts the workers' cells
    assert all(line.startswith("replaysafe: ") for line in progress)  # a line of its own, after the dots
    closing = out[next(i for i, line in enumerate(out) if line.startswith("proved: ")) : -1]
    assert closing[0].startswith("proved: ") and "memory, sqlite" in closing[0]
    assert closing[1].startswith("known gaps: ") and "xfailed tests" in closing[1]
    assert " ".join(closing[2:]).split() == ["reports:", str(data), str(html)]
    assert "xfailed" in out[-1]

    cells = json.loads(data.read_text())["cells"]
    gap = next(
        c for c in cells if (c["point"], c["mode"], c["outcome"]) == ("tool.after_return", "sigkill", "known_gap")
    )
    phases = [e["phase"] for e in gap["timeline"]]
    assert phases.index("crash") > phases.index("run") and phases[-1] == "resume"
    assert any("started AGAIN" in e["text"] for e in gap["timeline"] if e["phase"] == "resume")
    assert "after_return" in gap["gap_reasons"]
    kept = [
        c for c in cells if (c["point"], c["outcome"]) == ("tool.after_record", "protected") and "refund" in c["test"]
    ]
    assert any("answered from its ledger record" in e["text"] for c in kept for e in c["timeline"])

    if browser.chromium() is None:
        if os.environ.get(browser.ENV_REQUIRE):
            pytest.fail("no chromium on PATH, and REPLAYSAFE_REQUIRE_BROWSER is set: apt-get install -y chromium")
        pytest.skip("no chromium on PATH (apt-get install -y chromium)")
    assert browser.check(html) == []
    index = cells.index(gap)
    shown = browser.render(html, f"cell={index}")
    assert ("crash", f"kill -9 of the run's process at tool.after_return, hit {gap['hit']}") in shown.timeline
    assert shown.timeline[-1][0] == "gap rule"
    filtered = browser.render(html, "backend=sqlite&mode=sigkill")
    assert filtered.grid_rows[0] == ["crash point", "sqlite"] and filtered.grid_rows[1] == ["sigkill"]


def test_progress_is_quiet_under_q(tmp_path: Path) -> None:
    done = run_examples(tmp_path, "-q", "--crash-progress=0", "--crash-points=run.before_node")
    assert done.returncode == 0, done.stdout[-3000:]
    assert " cells, " not in done.stdout.replace("cells, 0", "")
    assert not [line for line in done.stdout.splitlines() if line.startswith("replaysafe: ")]


@pytest.mark.parametrize("value", ["soon", "-1"])
def test_a_progress_interval_that_is_not_one_is_a_usage_error(tmp_path: Path, value: str) -> None:
    done = run_examples(tmp_path, f"--crash-progress={value}")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR
    assert f"--crash-progress={value!r}: give seconds (0 or more) or 'off'" in done.stderr
