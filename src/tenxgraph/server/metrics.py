"""``GET /metrics``: the server's counters and run latencies in the Prometheus text format (version 0.0.4).

Per process (scrape every worker). Counted from the runtime's own signals: its structured events (replayed
calls, in-doubt calls, failed record writes, resumed runs, recoveries), its tool observer (calls executed, timed
out) and the server's runs (finished, failed, refused as busy, with their latency)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from tenxgraph.core.graph.utils.instrument import ToolEvent
from tenxgraph.utils.instrument import Instrument, install
from tenxgraph.utils.thread_share import outliving_threads

#: Run latency buckets, in seconds.
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: event name -> (counter, label) it counts into
EVENTS = {
    "tool_replayed": ("tenxgraph_tool_calls_total", 'how="replayed"'),
    "tool_in_doubt": ("tenxgraph_tool_in_doubt_total", ""),
    "ledger_write_failed": ("tenxgraph_ledger_write_errors_total", ""),
    "run_resumed": ("tenxgraph_runs_resumed_total", ""),
    "tool_rejected": ("tenxgraph_tool_calls_total", 'how="rejected"'),
    "run_recovered": ("tenxgraph_recoveries_total", 'outcome="recovered"'),
    "recovery_failed": ("tenxgraph_recoveries_total", 'outcome="failed"'),
    "recovery_parked": ("tenxgraph_recoveries_total", 'outcome="parked"'),
}
HELP = {
    "tenxgraph_runs_total": "Runs the server ran, for a request or its recovery, by outcome (busy: refused with 409).",
    "tenxgraph_tool_calls_total": "Tool calls, executed (the body ran), replayed (answered from the ledger) or "
    "rejected (a person said no: never run).",
    "tenxgraph_interrupts_total": "Pauses for a person: interrupts asked (a run stopped for them) and decided (a "
    "Resume's answers recorded).",
    "tenxgraph_tool_timeouts_total": "Tool calls cancelled by tool_timeout.",
    "tenxgraph_tool_in_doubt_total": "Tool calls a resume found in doubt (intent, no result).",
    "tenxgraph_ledger_write_errors_total": "Ledger record writes that failed (the call may run again).",
    "tenxgraph_runs_resumed_total": "Runs that resumed a thread an earlier run left unfinished.",
    "tenxgraph_recoveries_total": "Interrupted threads the server's recovery handled, by outcome.",
}


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: Counter[tuple[str, str]] = Counter()
        self._latency = [0] * len(BUCKETS)
        self._latency_sum = 0.0
        self._latency_count = 0
        self._removers: list[Callable[[], None]] = []

    def start(self) -> None:
        self._removers = [install(Instrument(on_event=self.on_event, on_tool=self.on_tool))]

    def stop(self) -> None:
        for remove in self._removers:
            remove()
        self._removers = []

    def count(self, name: str, labels: str = "", n: int = 1) -> None:
        with self._lock:
            self.counters[name, labels] += n

    def on_event(self, event: str, fields: dict[str, Any]) -> None:
        if event in EVENTS:
            self.count(*EVENTS[event])
        if event == "run_paused":
            self.count("tenxgraph_interrupts_total", 'how="asked"', len(fields.get("interrupts") or ()))
        elif event == "interrupts_decided":
            self.count("tenxgraph_interrupts_total", 'how="decided"', len(fields.get("ids") or ()))
        if event == "run_recovered":  # a recovered run is a run: counted and timed like a request's
            self.run("finished", float(fields.get("seconds") or 0.0))
        elif event == "recovery_failed":
            self.run("failed", 0.0)

    def on_tool(self, event: ToolEvent) -> None:
        if event.kind == "start":
            self.count("tenxgraph_tool_calls_total", 'how="executed"')
        elif event.kind == "timeout":
            self.count("tenxgraph_tool_timeouts_total")

    def run(self, outcome: str, seconds: float) -> None:
        self.count("tenxgraph_runs_total", f'outcome="{outcome}"')
        if outcome != "finished":
            return
        with self._lock:
            self._latency_sum += seconds
            self._latency_count += 1
            for i, bound in enumerate(BUCKETS):
                if seconds <= bound:
                    self._latency[i] += 1

    def render(self, waiting_threads: int | None = None) -> str:
        """The text format; *waiting_threads*: how many threads wait for a person now (read from the storage)."""
        with self._lock:
            counters = dict(self.counters)
            latency, total, count = list(self._latency), self._latency_sum, self._latency_count
        lines: list[str] = []
        for name, text in HELP.items():
            lines += [f"# HELP {name} {text}", f"# TYPE {name} counter"]
            found = {labels: n for (metric, labels), n in counters.items() if metric == name}
            for labels, n in sorted(found.items()) or [("", 0)]:
                lines.append(f"{name}{{{labels}}} {n}" if labels else f"{name} {n}")
        name = "tenxgraph_run_seconds"
        lines += [f"# HELP {name} Latency of finished runs, request to answer.", f"# TYPE {name} histogram"]
        lines += [f'{name}_bucket{{le="{bound:g}"}} {n}' for bound, n in zip(BUCKETS, latency, strict=True)]
        lines += [f'{name}_bucket{{le="+Inf"}} {count}', f"{name}_sum {total:.6f}", f"{name}_count {count}"]
        name = "tenxgraph_tool_threads_outliving"
        lines += [f"# HELP {name} Threads still running a sync tool whose call was cut (its timeout, its run's end)."]
        lines += [f"# TYPE {name} gauge", f"{name} {outliving_threads()}"]
        if waiting_threads is not None:
            name = "tenxgraph_threads_waiting"
            lines += [f"# HELP {name} Threads paused for a person (status interrupted) in the storage, now."]
            lines += [f"# TYPE {name} gauge", f"{name} {waiting_threads}"]
        return "\n".join(lines) + "\n"
