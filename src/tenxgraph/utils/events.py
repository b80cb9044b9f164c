"""Structured events: one log record per thing that happened, with its fields machine-readable.

Each event goes to the ``tenxgraph.events`` logger as a JSON line and in ``record.tenxgraph_event`` (a dict), so a
handler can index the fields (``tenxgraph serve`` prints every record as one JSON line)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from tenxgraph.utils import instrument
from tenxgraph.utils.constants import LOGGER_NAME

events_log = logging.getLogger(f"{LOGGER_NAME}.events")


def add_event_observer(observer: Callable[[str, dict[str, Any]], None]) -> Callable[[], None]:
    """Call *observer* with every event's name and fields, whatever the log level (a server's metrics count them).
    Returns a function that removes it; observers must be quick. (An :class:`~tenxgraph.utils.instrument.Instrument`
    with ``on_event``.)"""
    return instrument.install(instrument.Instrument(on_event=observer))


def emit_event(event: str, level: int = logging.WARNING, **fields: Any) -> None:
    """Log *event* with *fields* (JSON values) at *level*."""
    for watcher in instrument.installed:
        if watcher.on_event is not None:
            watcher.on_event(event, fields)
    if not events_log.isEnabledFor(level):
        return
    payload = {"event": event, **fields}
    events_log.log(level, json.dumps(payload, sort_keys=True, default=str), extra={"tenxgraph_event": payload})


class JsonLineFormatter(logging.Formatter):
    """Every record as one JSON object on one line: time, level, logger, and the event's fields or the message."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
        }
        event = getattr(record, "tenxgraph_event", None)
        if isinstance(event, dict):
            line.update(event)
        else:
            line["message"] = record.getMessage()
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def log_json_lines(level: int | str = logging.INFO) -> logging.Handler:
    """Send the ``tenxgraph`` loggers' records at *level* and above to stderr as JSON lines."""
    handler = logging.StreamHandler()
    formatter = JsonLineFormatter()
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    logger = logging.getLogger(LOGGER_NAME)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return handler
