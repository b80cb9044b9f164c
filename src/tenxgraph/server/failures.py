"""What a client is told of a run that failed: a generic message and an error id, the same in the run's answer
and in the thread's state; the cause (an exception's text may hold a DSN, a provider's reply, a host) stays in
the operator's log under that id."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

GENERIC = "the run failed; the server's log has the cause under error_id {}; post again to resume"


def error_id_of(stored_thread_id: str, cause: str) -> str:
    """A failure's id, derived from its thread and its stored cause: the run's 500 and ``GET /state`` agree."""
    return "err_" + hashlib.sha256(f"{stored_thread_id}\n{cause}".encode()).hexdigest()[:16]


def public_values(stored_thread_id: str, values: dict[str, Any]) -> dict[str, Any]:
    """A thread's values as a client sees them: a failed node's cause (``meta.error``) replaced by the generic
    message and its error id (``meta.error_id``)."""
    meta = values.get("meta")
    if not isinstance(meta, dict) or not meta.get("error"):
        return values
    shown = copy.copy(values)
    error_id = error_id_of(stored_thread_id, str(meta["error"]))
    shown["meta"] = {**meta, "error": GENERIC.format(error_id), "error_id": error_id}
    return shown
