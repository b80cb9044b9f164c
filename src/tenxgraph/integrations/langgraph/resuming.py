"""Resuming a LangGraph thread after a crash, the way that works whenever the crash came.

LangGraph goes on from a thread's last checkpoint with ``invoke(None, config)``; but a crash before the first
checkpoint was saved leaves the thread empty, and ``invoke(None, config)`` then raises LangGraph's
``EmptyInputError``: the input must be sent again. :func:`resume` does the right one of the two (the crash-matrix
harness resumes through it too), so a user's resume is one line::

    result = resume(app, {"messages": [("user", "refund 1042")]}, config, durability="sync")

On a thread that finished, LangGraph has nothing to run: the stored state comes back, nothing runs again."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["aresume", "resume", "resume_input"]


def resume_input(app: Any, input: Any, config: Mapping[str, Any]) -> Any:
    """What to send to resume *config*'s thread of *app*: None when the thread has a checkpoint (LangGraph goes on
    from it and from the writes saved since), else *input* again (the crash came before the first one)."""
    return None if app.get_state(config).created_at is not None else input


def resume(app: Any, input: Any, config: Mapping[str, Any], **kwargs: Any) -> Any:
    """Resume *config*'s thread of the compiled LangGraph graph *app* after a crash (see the module's docstring):
    ``app.invoke(None, config)``, or ``app.invoke(input, config)`` if no checkpoint was saved. *kwargs* go to
    ``invoke`` (``durability="sync"``, as the run had)."""
    return app.invoke(resume_input(app, input, config), config, **kwargs)


async def aresume(app: Any, input: Any, config: Mapping[str, Any], **kwargs: Any) -> Any:
    """:func:`resume` for async graphs (``aget_state``, ``ainvoke``)."""
    start = None if (await app.aget_state(config)).created_at is not None else input
    return await app.ainvoke(start, config, **kwargs)
