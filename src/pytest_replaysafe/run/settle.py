"""Before a crash inside a batch of parallel calls: the siblings come to rest first, so that which of them had
returned, or been recorded, when the crash fires is decided by the seeded completion order, not by the threads.

A crash point fires in one call: in its worker thread for a plain-function tool's body (``tool.in_flight``), on
the event loop elsewhere. Its siblings' bodies may be running in other threads, and a body that has just returned
may not have been seen by the loop yet; crashing at once makes the cell's outcome a matter of the scheduler (a
sibling in flight in one run, returned or recorded in the next, for the same seed). So, first:

1. every other body running in a worker thread (:func:`tenxgraph.utils.sync.to_thread`) returns, or
   :data:`SETTLE_S` passes (a slow tool stays in flight, as it would);
2. from a worker thread, the event loop runs what those returns made runnable (a sibling's turn in the order, its
   record write) until it stops moving: two pings of the loop in a row that saw no new entry in the harness's log
   and no ledger write in progress. On the loop's own thread nothing more can run before the crash: the siblings
   stay as the loop last saw them.

The calls' completion order (``set_completion_order``) then decides what is recorded: a sibling whose turn comes
before the crashing call's is recorded, one whose turn comes after it waits, and is found in flight.
"""

from __future__ import annotations

import threading
import time

from pytest_replaysafe.run.spy import RecordingCheckpointer

#: The longest a crash waits for its siblings to come to rest, in seconds.
SETTLE_S = 0.2


def settle_siblings(checkpointer: RecordingCheckpointer, limit: float = SETTLE_S) -> None:
    """Let the crashing call's siblings come to rest (see the module's text), for at most *limit* seconds."""
    from tenxgraph.utils.sync import calling_loop, wait_threads_idle

    deadline = time.monotonic() + limit
    loop = calling_loop()  # (None on the loop's own thread)
    wait_threads_idle(limit, leave=1 if loop is not None else 0)
    if loop is None:
        return
    path = checkpointer.log.path
    quiet = 0
    while quiet < 2 and (left := deadline - time.monotonic()) > 0:
        before = path.stat().st_size if path.exists() else 0
        pinged = threading.Event()
        try:
            loop.call_soon_threadsafe(pinged.set)
        except RuntimeError:  # the loop is closed: nothing more will run
            return
        if not pinged.wait(left):
            return
        after = path.stat().st_size if path.exists() else 0
        if after == before and checkpointer.writing == 0:
            quiet += 1
        else:
            quiet = 0
            if checkpointer.writing:
                time.sleep(0.0005)  # (a write waits on its storage: no need to ping the loop meanwhile)
