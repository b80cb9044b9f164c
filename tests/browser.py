"""Load a ``--crash-html`` report in a real headless browser (Debian's ``chromium``) and check what it rendered.

Used by tests/test_report_output.py and by ``.ci/run`` on the report ``make demo`` wrote:
``python tests/browser.py crash-matrix.html``. The page runs its script, then the DOM is dumped and parsed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

ENV_REQUIRE = "REPLAYSAFE_REQUIRE_BROWSER"


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def dump_dom(page: Path, fragment: str = "") -> str:
    browser = chromium()
    if browser is None:
        raise RuntimeError("no chromium on PATH: install Debian's package (apt-get install -y chromium)")
    url = page.resolve().as_uri() + (f"#{fragment}" if fragment else "")
    args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000", "--dump-dom", url]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


@dataclass
class Rendered:
    ready: bool
    grid_rows: list[list[str]]  # each row's cell texts
    timeline: list[tuple[str, str]]  # (phase, text)
    cells_listed: int


class _Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ready = False
        self.rows: list[list[str]] = []
        self.timeline: list[tuple[str, str]] = []
        self.cells_listed = 0
        self._in: str | None = None  # grid | timeline | cells, while inside that element
        self._depth = 0
        self._phase: list[str] | None = None  # the timeline entry's phase label, while inside it
        self._phase_text: list[str] = []
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "body" and a.get("data-ready") == "1":
            self.ready = True
        if tag in ("table", "ol", "ul") and a.get("id") in ("grid", "timeline", "cells"):
            self._in, self._depth = a["id"], 0
        if self._in is None:
            return
        self._depth += tag in ("table", "ol", "ul")
        if tag == "tr" and self._in == "grid":
            self.rows.append([])
        if (tag in ("td", "th") and self._in == "grid") or tag == "li":
            self._text, self._phase_text = [], []
            self.cells_listed += tag == "li" and self._in == "cells"
        if tag == "span" and a.get("class") == "phase":
            self._phase = self._phase_text

    def handle_endtag(self, tag: str) -> None:
        if self._in is None:
            return
        if tag == "span":
            self._phase = None
        if tag in ("td", "th") and self._in == "grid" and self.rows:
            self.rows[-1].append(" ".join("".join(self._text).split()))
        if tag == "li" and self._in == "timeline":
            self.timeline.append(("".join(self._phase_text).strip(), " ".join("".join(self._text).split())))
        if tag in ("table", "ol", "ul"):
            self._depth -= 1
            if self._depth <= 0:
                self._in = None

    def handle_data(self, data: str) -> None:
        if self._phase is not None:
            self._phase.append(data)
        elif self._in is not None:
            self._text.append(data)


def render(page: Path, fragment: str = "") -> Rendered:
    parser = _Parser()
    parser.feed(dump_dom(page, fragment))
    return Rendered(parser.ready, parser.rows, parser.timeline, parser.cells_listed)


def check(page: Path) -> list[str]:
    """Problems with a report's rendering: the grid must show every point, the exposure table every row, the
    coverage table every dimension, and a
    known-gap (or failing) cell's timeline must show its run, crash, resume and verdict."""
    text = page.read_text(encoding="utf-8")
    found = re.search(r'<script type="application/json" id="data">(.*?)</script>', text, re.S)
    if found is None:
        return ["no embedded data"]
    data = json.loads(found.group(1))
    cells = data["cells"]
    pick = next((i for i, c in enumerate(cells) if c["outcome"] != "protected" and c["timeline"]), 0)
    shown = render(page, f"cell={pick}")
    problems = []
    if not shown.ready:
        problems.append("the page's script did not finish (no data-ready)")
    listed = {row[0] for row in shown.grid_rows if row}
    missing = [p["name"] for p in data["points"] if p["name"] not in listed]
    if missing:
        problems.append(f"grid rows missing: {missing}")
    exposure = (data.get("exposure") or {}).get("rows") or []
    if exposure:
        table = re.search(r'<table id="exposure-table">(.*?)</table>', dump_dom(page), re.S)
        rows = table.group(1).count("<tr>") - 1 if table else 0
        if rows != len(exposure):
            problems.append(f"the exposure table shows {rows} rows, the report has {len(exposure)}")
    coverage = data.get("coverage")
    if coverage:  # every dimension of the matrix's own coverage, each a row
        table = re.search(r'<table id="coverage-table">(.*?)</table>', dump_dom(page), re.S)
        rows = table.group(1).count("<tr>") - 1 if table else 0
        if rows != len(coverage):
            problems.append(f"the coverage table shows {rows} rows, the report has {len(coverage)} dimensions")
    phases = [phase for phase, _ in shown.timeline]
    for phase in ("crash", "resume", "verdict"):
        if cells[pick]["timeline"] and phase not in phases:
            problems.append(f"the timeline of cell {pick} has no {phase} entry: {shown.timeline}")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tests/browser.py REPORT.html", file=sys.stderr)
        return 2
    if chromium() is None and not os.environ.get(ENV_REQUIRE):
        print("browser check skipped: no chromium (apt-get install -y chromium)")
        return 0
    problems = check(Path(argv[0]))
    for problem in problems:
        print(f"browser check: {problem}", file=sys.stderr)
    if not problems:
        print(f"browser check: {argv[0]} renders its grid and a cell's timeline in headless chromium")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
