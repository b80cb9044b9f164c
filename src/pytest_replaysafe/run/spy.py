"""The harness's view of the ledger: a checkpointer wrapper that logs every record write, independently of the
runtime's own instrumentation (a broken runtime cannot hide a record it wrote too early or with a wrong value)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Any

from pytest_replaysafe.judge.evidence import Entry, ExecutionLog, fingerprint, preview
from pytest_replaysafe.judge.gaps import RECORD_FAILED
from pytest_replaysafe.matrix.cells import first_state_path
from tenxgraph.state.messages import JSON, Message
from tenxgraph.storage.checkpointer.base import BaseCheckpointer
from tenxgraph.storage.checkpointer.delegating import DelegatingCheckpointer
from tenxgraph.utils.errors import SerializationError


class RecordingCheckpointer(DelegatingCheckpointer):
    """Logs ledger writes to *log*. ``bypass_lock`` makes the run lock a no-op: the harness uses it to stand for a
    run that got the lock because another run lost it."""

    def __init__(self, inner: BaseCheckpointer, log: ExecutionLog) -> None:
        super().__init__(inner)
        self.log = log
        self.bypass_lock = False
        self.writing = 0  # ledger writes begun and not ended (see .settle)

    async def aput_thread(
        self, thread_id: str, values: dict[str, JSON], *, expected_version: int, new_messages: Sequence[Message] = ()
    ) -> int:
        version = await super().aput_thread(
            thread_id, values, expected_version=expected_version, new_messages=new_messages
        )
        if expected_version == 0:  # the state a cache could hold stale later (see matrix.Backend.stale_cache)
            first_state_path(self.log.path.parent, thread_id).write_text(json.dumps(values))
        return version

    async def aput_tool_result(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        if record.get("kind") == "model_response":  # a journaled model turn (Pydantic AI): no tool call's record
            written = await self.inner.aput_tool_result(thread_id, key, record)
            fp = fingerprint(record.get("payload"))
            self.log.write(Entry(thread_id, key, "journaled", fp=fp, cond=None if written else "not_first"))
            return written
        begun = _record_entry(thread_id, key, record)
        tool, fp = begun.tool, begun.fp
        self.log.write(begun)
        self.writing += 1
        try:
            written = await super().aput_tool_result(thread_id, key, record)
        except SerializationError:  # the value cannot be stored: the runtime records an error result instead
            raise
        except Exception:
            self.log.write(Entry(thread_id, key, "record_failed", tool, cond=RECORD_FAILED))
            raise
        finally:
            self.writing -= 1
        self.log.write(Entry(thread_id, key, "recorded", tool, fp))
        return written

    async def aput_tool_results(
        self, thread_id: str, records: Sequence[tuple[str, dict[str, JSON]]]
    ) -> list[bool | SerializationError]:
        """A group commit, logged as what it is: every record begun, one write, every record done. A person's
        decisions (a Resume's, written together) are logged as ``decided``, once written."""
        if records and all(r.get("kind") == "decision" for _, r in records):
            written = await self.inner.aput_tool_results(thread_id, records)
            for (key, record), outcome in zip(records, written, strict=True):
                value, first = _decision(record.get("value")), None if outcome is True else "not_first"
                # (a LangGraph step's answer names no interrupt; a Pydantic AI answer names its call)
                about = str(record.get("interrupt") or record.get("call") or key)
                decided = Entry(thread_id, about, "decided", fp=fingerprint(value), cond=first)
                self.log.write(replace(decided, out=preview(value)))
            return written
        entries = []
        for key, record in records:
            begun = _record_entry(thread_id, key, record, group=len(records))
            entries.append((key, begun.tool, begun.fp, begun.error))
            self.log.write(begun)
        self.writing += 1
        try:
            written = await self.inner.aput_tool_results(thread_id, records)
        except Exception:
            for key, tool, _, _ in entries:
                self.log.write(Entry(thread_id, key, "record_failed", tool, cond=RECORD_FAILED))
            raise
        finally:
            self.writing -= 1
        for (key, tool, fp, _), outcome in zip(entries, written, strict=True):
            if not isinstance(outcome, SerializationError):
                self.log.write(Entry(thread_id, key, "recorded", tool, fp))
        return written

    async def atransact(self, thread_id: str, key: str, work: Callable[[Any], Any]) -> tuple[dict[str, JSON], bool]:
        """A transactional tool's record, logged once committed (with the tool's writes)."""
        stored, wrote = await self.inner.atransact(thread_id, key, work)
        if wrote:
            begun = _record_entry(thread_id, key, stored)
            self.log.write(begun)
            self.log.write(Entry(thread_id, key, "recorded", begun.tool, begun.fp))
        return stored, wrote

    @contextlib.asynccontextmanager
    async def arun_lock(self, thread_id: str) -> AsyncIterator[None]:
        if self.bypass_lock:
            yield
            return
        async with self.inner.arun_lock(thread_id):
            yield

    async def acheck_run_lock(self, thread_id: str) -> None:
        if not self.bypass_lock:
            await super().acheck_run_lock(thread_id)


def _record_entry(thread_id: str, key: str, record: dict[str, JSON], group: int | None = None) -> Entry:
    """A record write begun: what it holds (output, error flag, state update) and the size of its group commit."""
    tool = str(record["tool"]) if record.get("tool") else None
    update = record.get("update")
    ufp = fingerprint(update) if update is not None else None
    fp = fingerprint(record.get("output"))
    return Entry(thread_id, key, "record", tool, fp, ufp, group, bool(record.get("is_error")))


def _decision(value: JSON) -> JSON:
    """A recorded decision as the verdict compares it: Pydantic AI's plain approval (``ToolApproved()``, stored
    as its JSON form) is a yes, ``True``; any other value as it is (a denial, an approval that changes the
    arguments); the result given for a call deferred as external (``ToolReturn``, stored as its JSON form) is
    its return value."""
    if isinstance(value, dict) and value.get("kind") == "tool-approved" and value.get("override_args") is None:
        return True
    if isinstance(value, dict) and value.get("kind") == "tool-return" and not value.get("content"):
        return value.get("return_value")
    return value
