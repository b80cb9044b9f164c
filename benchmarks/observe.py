"""What watching a run costs: tracing switched off, on, and token streaming, on the refund run in memory (the
backend where the runtime's own work shows most).

Contenders, interleaved in chunks of 10 runs so that load on a shared machine hits all alike, repeated ``--reps``
times; per contender the ratio of its median to the baseline's, min and median over the repetitions:

- ``baseline``: tracing taken out (the run never asks OpenTelemetry for a tracer provider), as before tracing;
- ``baseline_again``: the same again, whose ratio is the noise of the measurement itself;
- ``tracing_off``: the default, no tracer provider configured (one check per run);
- ``tracing_on``: an SDK tracer provider whose spans are made and dropped (no exporter);
- ``stream_messages``: ``stream(stream_mode="messages")`` (tokens and results streamed) instead of ``invoke``.

Tracing off is *within noise* when its median ratio is within the noise band (the baseline-again ratio's distance
from 1, at least 3%).

    python -m benchmarks.observe [--runs 200] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import scenario
from benchmarks.bench import compare
from tenxgraph.core.graph import compiled
from tenxgraph.storage.checkpointer import InMemoryCheckpointer

RESULTS = Path(__file__).with_name("observe.json")


def contenders() -> dict[str, Callable[[], None]]:
    from opentelemetry.sdk.trace import TracerProvider

    app = scenario.tenxgraph_app(InMemoryCheckpointer())
    provider = TracerProvider()  # no span processor: spans are made and dropped

    def run(config: dict[str, Any] | None = None) -> None:
        result = app.invoke(scenario.tenxgraph_input(), {"thread_id": uuid.uuid4().hex, **(config or {})})
        assert result.final_text.startswith("Refunded"), result.final_text

    def baseline() -> None:
        real = getattr(compiled, "tracer_for")  # noqa: B009 (patched for the baseline, then put back)
        setattr(compiled, "tracer_for", lambda provider: None)  # noqa: B010
        try:
            run()
        finally:
            setattr(compiled, "tracer_for", real)  # noqa: B010

    def streamed() -> None:
        for _ in app.stream(scenario.tenxgraph_input(), {"thread_id": uuid.uuid4().hex}, stream_mode="messages"):
            pass

    return {
        "baseline": baseline,
        "baseline_again": baseline,
        "tracing_off": run,
        "tracing_on": lambda: run({"tracer_provider": provider}),
        "stream_messages": streamed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    ratios: dict[str, list[float]] = {}
    medians: dict[str, list[float]] = {}
    for _ in range(args.reps):
        figures = compare(contenders(), args.runs, 20)
        for name, row in figures.items():
            medians.setdefault(name, []).append(row["median_ms"])
            ratios.setdefault(name, []).append(round(row["median_ms"] / figures["baseline"]["median_ms"], 3))
    noise = max(0.03, max(abs(r - 1) for r in ratios["baseline_again"]))
    rows = {
        name: {
            "median_ms": statistics.median(medians[name]),
            "ratio_min": min(ratios[name]),
            "ratio_median": statistics.median(ratios[name]),
        }
        for name in ratios
    }
    off = rows["tracing_off"]["ratio_median"]
    verdict = "met" if abs(off - 1) <= noise else "missed"
    load = os.getloadavg()[0]
    result = {"rows": rows, "noise": round(noise, 3), "tracing_off_within_noise": verdict, "load_1min": load}
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"refund run in memory, {args.reps} x {args.runs} runs per contender, load {load:.1f}")
    print(f"{'contender':16} {'median ms':>10} {'ratio min':>10} {'ratio median':>13}")
    for name, row in rows.items():
        print(f"{name:16} {row['median_ms']:>10.3f} {row['ratio_min']:>10} {row['ratio_median']:>13}")
    print(f"tracing off within noise (+-{noise:.3f} of the baseline): {verdict}")
    print(f"written: {RESULTS}")


if __name__ == "__main__":
    main()
