"""Checks that a figure the docs print is what the docs' own command prints today (#25): run by `.ci/run` after
that command, on its JSON report. A figure left behind by a code change fails CI, naming the new one.

    python tests/doc_figures.py depth2 crash-matrix-depth2.json
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

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


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] != "depth2":
        print(__doc__, file=sys.stderr)
        return 2
    problems = check_depth2(Path(argv[2]))
    for p in problems:
        print(f"docs/crash-matrix.md depth-2 figure is stale: {p}; re-run the command it gives and update it")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
