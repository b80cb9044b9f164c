"""``make bench``'s last step: every benchmark's JSON in one ``benchmarks/results.json`` (sections ``refund``,
``parallel``, ``turns``, ``floor``, ``observe``, ``redis_cache``, ``server_chaos``), and the median ratios against
their targets printed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
SECTIONS = {name: f"{name}.json" for name in ("parallel", "turns", "floor", "observe", "redis_cache", "server_chaos")}
TARGETS = {"memory": 0.12, "sqlite": 0.35, "postgres": 0.35, "postgres+redis": 0.35}


def main() -> None:
    results_path = HERE / "results.json"
    refund: dict[str, Any] = json.loads(results_path.read_text()) if results_path.exists() else {}
    merged: dict[str, Any] = {"refund": refund.get("refund", refund)}
    for name, file in SECTIONS.items():
        path = HERE / file
        if path.exists():
            merged[name] = json.loads(path.read_text())
    results_path.write_text(json.dumps(merged, indent=2) + "\n")
    print(f"{'shape':32} {'backend':15} {'ours / LangGraph (median)':>26} {'target':>7}")
    for row in merged.get("parallel", {}).get("rows", []):
        if "ratio_median" in row:
            target = TARGETS.get(row["backend"], 0.35)
            ok = "ok" if row["ratio_median"] <= target else "MISSED"
            print(f"{'parallel N=' + str(row['n']):32} {row['backend']:15} {row['ratio_median']:>26} {target:>7} {ok}")
    for backend, row in merged.get("turns", {}).get("backends", {}).items():
        for turn, ratio in row.get("ratio", {}).items():
            target = TARGETS.get(backend, 0.35)
            ok = "ok" if ratio["median"] <= target else "MISSED"
            print(f"{'turn ' + turn:32} {backend:15} {ratio['median']:>26} {target:>7} {ok}")
    observe = merged.get("observe")
    if observe:
        off = observe["rows"]["tracing_off"]
        print(
            f"{'tracing off (ratio to none)':32} {'memory':15} {off['ratio_median']:>26} "
            f"{'+-' + str(observe['noise']):>7} {'ok' if observe['tracing_off_within_noise'] == 'met' else 'MISSED'}"
        )
    print(f"written to {results_path}")


if __name__ == "__main__":
    main()
