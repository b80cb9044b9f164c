"""Checks that a figure the docs print is what the docs' own command prints today (#25): run by `.ci/run` after
that command, on its JSON report (the LangGraph table: by tests/test_langgraph_gate.py, which runs the command in
`make test`). A figure left behind by a code change fails CI, naming the new one.

    python tests/doc_figures.py depth2 crash-matrix-depth2.json
    python tests/doc_figures.py langgraph langgraph-matrix.json          # check docs/langgraph.md's table
    python tests/doc_figures.py langgraph langgraph-matrix.json --table  # print the table from a report
    python tests/doc_figures.py approvals crash-matrix.json              # docs/approvals.md's table
    python tests/doc_figures.py loop loop-matrix.json [--table]          # docs/plain-loop.md's table
    python tests/doc_figures.py agents agents-matrix.json [--table]      # docs/openai-agents.md's table
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from tenxgraph.core.point_groups import LANGGRAPH_POINTS, LOOP_POINTS, OPENAI_AGENTS_POINTS

DOC = Path(__file__).resolve().parents[1] / "docs" / "crash-matrix.md"
#: The depth-2 closing line as the docs show it (the "possible" count may differ by a few between runs: how far a
#: resume's parallel calls get before each later crash point is the threads' race).
DEPTH2 = re.compile(
    r"depth 2: (?P<ran>\d+) schedules of (?P<candidates>\d+) possible in (?P<items>\d+) items "
    r"\((?P<enumerated>\d+) enumerated, (?P<sampled>\d+) sampled by seed;"
)
SLACK = 0.01  # of the possible schedules


def check_depth2(report: Path) -> list[str]:
    found = DEPTH2.search(" ".join(DOC.read_text().split()))
    if found is None:
        return [f"{DOC}: no line 'depth 2: N schedules of M possible in K items (...)' to check"]
    shown = {k: int(v) for k, v in found.groupdict().items()}
    got = json.loads(report.read_text())["schedules"]
    now = {
        "ran": got["enumerated"] + got["sampled"],
        "candidates": got["candidates"],
        "items": got["items"],
        "enumerated": got["enumerated"],
        "sampled": got["sampled"],
    }
    problems = [
        f"{k}: the docs say {shown[k]}, the command gives {now[k]}"
        for k in now
        if k != "candidates" and shown[k] != now[k]
    ]
    if abs(shown["candidates"] - now["candidates"]) > SLACK * now["candidates"]:
        problems.append(
            f"candidates: the docs say {shown['candidates']} (within 1%), the command gives {now['candidates']}"
        )
    return problems


LANGGRAPH_DOC = DOC.parent / "langgraph.md"
LG_ROW = re.compile(
    r"^\| `(?P<point>[a-z_.]+)` \| (?P<cells>\d+ / \d+) \| (?P<bare>[^|]+) \| (?P<safe>[^|]+) \| (?P<tx>[^|]+) \|", re.M
)


def langgraph_rows(report: Path) -> dict[str, tuple[str, str, str, str]]:
    """Per point, over the in-process cells of examples/langgraph_support: the cells of each variant (``bare /
    ReplaySafeToolNode``: the latter runs each hit in two completion orders of its parallel calls), what the bare
    ToolNode showed (violations, vacuous), what ReplaySafeToolNode showed (violations, known gaps), and in how
    many cells of the transactional refund (``test_transactional_refund``) the refund was made exactly once."""
    cells = [c for c in json.loads(report.read_text())["cells"] if c["mode"] == "inprocess"]
    rows = {}
    for point in LANGGRAPH_POINTS:
        bare = [c for c in cells if c["point"] == point and "test_bare_tool_node" in c["test"]]
        safe = [c for c in cells if c["point"] == point and "test_replay_safe_tool_node" in c["test"]]

        def count(group: list[dict[str, object]], outcome: str) -> int:
            return sum(1 for c in group if c["outcome"] == outcome)

        vacuous = count(bare, "vacuous")
        shown = "never reached: nothing records" if vacuous else f"{count(bare, 'violation')} violations"
        violations, gaps = count(safe, "violation"), count(safe, "known_gap")
        tx = [c for c in cells if c["point"] == point and "test_transactional_refund" in c["test"]]
        once = sum(1 for c in tx if c["outcome"] != "violation" and c["effects_applied"].get("refund") == 1)
        made = f"once in {once} of {len(tx)} cells"
        rows[point] = (f"{len(bare)} / {len(safe)}", shown, f"{violations} violations, {gaps} gaps", made)
    return rows


def _bare_matches(shown: str, now: str) -> bool:
    """``A-B violations`` (a range: LangGraph saves a task's writes while the next step runs, so a step-boundary
    crash sometimes lands in the tool step), ``N violations`` (give or take one, never 0 for N > 0, nor more
    than 0 for N = 0), or ``never reached``."""
    if "never" in shown or "never" in now:
        return ("never" in shown) == ("never" in now)
    count = int(now.split()[0])
    low, _, high = shown.split()[0].partition("-")
    if high:
        return int(low) <= count <= int(high)
    return (count > 0) == (int(low) > 0) and abs(count - int(low)) <= 1


def check_langgraph(report: Path) -> list[str]:
    """The cells per point and which side has violations are what the command gives (how many of the bare node's
    hits show one depends on which sibling threads had finished: a count may move by one)."""
    shown = {m["point"]: m for m in LG_ROW.finditer(LANGGRAPH_DOC.read_text())}
    problems = []
    for point, (cells, bare, safe, made) in langgraph_rows(report).items():
        row = shown.get(point)
        if row is None:
            problems.append(f"no row for {point}")
            continue
        if row["cells"] != cells:
            problems.append(f"{point}: the docs say {row['cells']} cells, the command gives {cells}")
        if not _bare_matches(row["bare"].strip(), bare):
            problems.append(f"{point}: the docs say the bare ToolNode shows {row['bare'].strip()!r}, now {bare!r}")
        if not safe.startswith("0 violations"):
            problems.append(f"{point}: ReplaySafeToolNode shows {safe!r}")
        if not row["safe"].strip().startswith("0 violations"):
            problems.append(f"{point}: the docs say ReplaySafeToolNode shows {row['safe'].strip()!r}")
        once, _, total = made.removeprefix("once in ").removesuffix(" cells").partition(" of ")
        if once != total or total == "0":
            problems.append(f"{point}: the transactional refund was made once in {once} of {total} cells")
        if row["tx"].strip() != made:
            said = row["tx"].strip()
            problems.append(f"{point}: the docs say the transactional refund was made {said!r}, now {made!r}")
    return problems


APPROVALS_DOC = DOC.parent / "approvals.md"
AP_ROW = re.compile(
    r"^\| (?P<what>[^|]+?) \| (?P<cells>\d+) \| (?P<protected>\d+) \| (?P<gap>\d+) \| (?P<bad>\d+) \|$", re.M
)


def approvals_rows(report: Path) -> dict[str, tuple[int, int, int, int]]:
    """Over the cells of examples/approved_refund (not-applicable ones aside), per group: cells, protected, known
    gap, and failing (violation, resume failed, failed, vacuous, error)."""
    cells = [c for c in json.loads(report.read_text())["cells"] if "approved_refund" in c["test"]]
    cells = [c for c in cells if c["outcome"] != "not_applicable"]
    groups = {
        "`approval.after_pause`": [c for c in cells if c["point"] == "approval.after_pause"],
        "`approval.after_decision`": [c for c in cells if c["point"] == "approval.after_decision"],
        "`double-resume` (every point)": [c for c in cells if c["mode"] == "double-resume"],
        "every cell": cells,
    }
    ok = ("protected", "known_gap", "in_doubt_handled", "exactly_once")
    return {
        name: (
            len(group),
            sum(c["outcome"] == "protected" for c in group),
            sum(c["outcome"] == "known_gap" for c in group),
            sum(c["outcome"] not in ok for c in group),
        )
        for name, group in groups.items()
    }


def check_approvals(report: Path) -> list[str]:
    now = approvals_rows(report)
    shown = {m["what"]: tuple(int(m[k]) for k in ("cells", "protected", "gap", "bad")) for m in AP_ROW.finditer(
        APPROVALS_DOC.read_text())}  # fmt: skip
    problems = [f"{name}: the docs say {shown.get(name)}, the command gives {row}" for name, row in now.items()
                if shown.get(name) != row]  # fmt: skip
    return problems + [f"{name}: {row[3]} failing cells" for name, row in now.items() if row[3]]


LOOP_DOC = DOC.parent / "plain-loop.md"
AGENTS_DOC = DOC.parent / "openai-agents.md"
ROW = re.compile(r"^\| `(?P<point>[a-z_.]+)` \| (?P<cells>\d+ / \d+) \| (?P<bare>[^|]+) \| (?P<safe>[^|]+) \|$", re.M)
#: Per doc: its example's points, its bare tests, its tests through the ledger (a name, or several), what a point
#: the bare ones never reach is called.
BEFORE_AFTER = {
    "loop": (LOOP_DOC, LOOP_POINTS, "::test_bare_support_loop[", "::test_support_loop[", "no ledger step to crash at"),
    "agents": (AGENTS_DOC, OPENAI_AGENTS_POINTS, ("::test_bare_agent[", "::test_bare_approved_refund["),
               ("::test_replay_safe_agent[", "::test_approved_refund["), "no ledger or journal step"),
}  # fmt: skip


def _named(test: str, names: str | tuple[str, ...]) -> bool:
    return any(name in test for name in ((names,) if isinstance(names, str) else names))


def before_after_rows(report: Path, which: str) -> dict[str, tuple[str, str, str]]:
    """Per point, over the cells of the example: the cells of each test (``bare / through the ledger``, not
    applicable ones aside), what the bare one showed (violations) and what the one through the ledger showed."""
    _, points, bare_test, safe_test, unreached = BEFORE_AFTER[which]
    cells = [c for c in json.loads(report.read_text())["cells"] if c["outcome"] != "not_applicable"]
    cells = [c for c in cells if c["mode"] in ("inprocess", "sigkill")]
    rows = {}
    for point in points:
        bare = [c for c in cells if c["point"] == point and _named(c["test"], bare_test)]
        safe = [c for c in cells if c["point"] == point and _named(c["test"], safe_test)]
        shown = f"{sum(c['outcome'] == 'violation' for c in bare)} violations" if bare else unreached
        rows[point] = (
            f"{len(bare)} / {len(safe)}",
            shown,
            f"{sum(c['outcome'] == 'violation' for c in safe)} violations",
        )
    return rows


def check_before_after(report: Path, which: str) -> list[str]:
    doc = BEFORE_AFTER[which][0]
    shown = {m["point"]: (m["cells"], m["bare"].strip(), m["safe"].strip()) for m in ROW.finditer(doc.read_text())}
    rows = before_after_rows(report, which)
    problems = [f"{point}: the docs say {shown.get(point)}, the command gives {row}"
                for point, row in rows.items() if shown.get(point) != row]  # fmt: skip
    return problems + [
        f"{point}: through the ledger: {row[2]}" for point, row in rows.items() if row[2] != "0 violations"
    ]


def check_loop(report: Path) -> list[str]:
    return check_before_after(report, "loop")


def check_agents(report: Path) -> list[str]:
    return check_before_after(report, "agents")


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[1] in BEFORE_AFTER:
        if argv[3:] == ["--table"]:
            for point, row in before_after_rows(Path(argv[2]), argv[1]).items():
                print(f"| `{point}` | {' | '.join(row)} |")
            return 0
        problems = check_before_after(Path(argv[2]), argv[1])
        for p in problems:
            print(f"{BEFORE_AFTER[argv[1]][0].name} table is stale: {p}; re-run the command it gives and update it")
        return 1 if problems else 0
    if len(argv) >= 3 and argv[1] == "approvals":
        if argv[3:] == ["--table"]:
            for name, row in approvals_rows(Path(argv[2])).items():
                print(f"| {name} | {' | '.join(map(str, row))} |")
            return 0
        problems = check_approvals(Path(argv[2]))
        for p in problems:
            print(f"docs/approvals.md table is stale: {p}; re-run the command it gives and update it")
        return 1 if problems else 0
    if len(argv) >= 3 and argv[1] == "langgraph":
        if argv[3:] == ["--table"]:
            for point, (cells, bare, safe, made) in langgraph_rows(Path(argv[2])).items():
                print(f"| `{point}` | {cells} | {bare} | {safe} | {made} |")
            return 0
        problems = check_langgraph(Path(argv[2]))
        for p in problems:
            print(f"docs/langgraph.md table is stale: {p}; re-run the command it gives and update it")
        return 1 if problems else 0
    if len(argv) != 3 or argv[1] != "depth2":
        print(__doc__, file=sys.stderr)
        return 2
    problems = check_depth2(Path(argv[2]))
    for p in problems:
        print(f"docs/crash-matrix.md depth-2 figure is stale: {p}; re-run the command it gives and update it")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
