"""How long ``python -m pytest_replaysafe merge`` takes on the full product's report, cut into N shards.

    make gate                                   # the full product's report: gate.json (about 12 minutes)
    python -m benchmarks.merge gate.json 4      # seconds to merge its 4 shards (JSON, Markdown and HTML)

The report's items are dealt into N shard reports by the plan ``--crash-shard`` uses (each with its ``shard``
part, as a shard run writes it), then merged three times; printed: the cells and items, each shard's size, and
the merge's median and slowest seconds with the machine's load. The merged cells must equal the report's. Also
printed: how far apart N shards would finish, each shard's cell seconds (as measured in the report) when the plan
deals items by count, and when it deals them by the report's own costs (``--crash-shard-costs``).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pytest_replaysafe.matrix.shards import Item, assign, digest, group_of
from pytest_replaysafe.report.merge import main as merge


def split(report: dict[str, Any], count: int, into: Path) -> list[Path]:
    """The report's cells as *count* shard reports of one plan."""
    backend = {c["test"]: c["backend"] for c in report["cells"]}
    items = [Item(nodeid, group_of(nodeid, backend[nodeid])) for nodeid in dict.fromkeys(backend)]
    shard_of = assign(items, count)
    plan = digest({"seed": report["seed"]}, count, shard_of)
    paths = []
    for k in range(1, count + 1):
        mine = [i.nodeid for i in items if shard_of[i.nodeid] == k]
        cells = [c for c in report["cells"] if shard_of[c["test"]] == k]
        shard = {"index": k, "count": count, "plan": plan, "total": len(items), "items": mine, "unfinished": []}
        part = {**report, "cells": cells, "shard": {**shard, "rate": "1/day", "xfailed": 0}}
        paths.append(into / f"shard-{k}.json")
        paths[-1].write_text(json.dumps(part))
    return paths


def balance(report: dict[str, Any], count: int) -> str:
    """Each shard's cell seconds under the plan by count and by the report's costs."""
    cost: dict[str, float] = {}
    backend: dict[str, str] = {}
    for c in report["cells"]:
        cost[c["test"]] = cost.get(c["test"], 0.0) + float(c["duration_s"])
        backend[c["test"]] = c["backend"]
    items = [Item(nodeid, group_of(nodeid, backend[nodeid])) for nodeid in cost]
    out = []
    for name, costs in (("by count", None), ("by costs", cost)):
        shard_of = assign(items, count, costs)
        spent = [round(sum(cost[n] for n, k in shard_of.items() if k == i)) for i in range(1, count + 1)]
        out.append(f"{name} {' / '.join(map(str, spent))} s (slowest {max(spent) * count / sum(spent):.3f} x even)")
    return "; ".join(out)


def main(argv: list[str]) -> int:
    source, count = Path(argv[0] if argv else "gate.json"), int(argv[1] if len(argv) > 1 else 4)
    report = json.loads(source.read_text())
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        parts = split(report, count, out)
        sizes = [len(json.loads(p.read_text())["cells"]) for p in parts]
        seconds = []
        for _ in range(3):
            started = time.perf_counter()
            args = [*map(str, parts), "--out", str(out / "m.json"), "--markdown", str(out / "m.md")]
            status = merge([*args, "--html", str(out / "m.html")])
            seconds.append(time.perf_counter() - started)
        merged = json.loads((out / "m.json").read_text())
    same = Counter(json.dumps(c, sort_keys=True) for c in merged["cells"]) == Counter(
        json.dumps(c, sort_keys=True) for c in report["cells"]
    )
    print(
        f"\nmerge of {source} in {count} shards: {len(report['cells'])} cells, "
        f"{len({c['test'] for c in report['cells']})} items, cells per shard {sizes}; merged cells equal the "
        f"report's: {same}; exit status {status}; seconds: median {statistics.median(seconds):.2f}, slowest "
        f"{max(seconds):.2f} (load {os.getloadavg()[0]:.2f})\nshards' cell seconds: {balance(report, count)}",
        file=sys.stderr,
    )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
