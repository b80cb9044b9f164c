"""The one place every integration records a person's answers to a run's pauses (tenxgraph.ledger's
``record_first_answers``): the first answer recorded stands on every backend, the same one again goes on, another is
refused naming the pause, and an answer that cannot be stored is an error, not a silent loss."""

from __future__ import annotations

from typing import cast

import pytest

from tenxgraph.ledger import record_first_answers
from tenxgraph.state.messages import JSON
from tenxgraph.storage.checkpointer import BaseCheckpointer
from tenxgraph.utils.errors import ConfigError, InterruptDecidedError
from tenxgraph.utils.sync import run_sync


def _answer(value: object) -> dict[str, tuple[str, dict[str, JSON]]]:
    record: dict[str, JSON] = {"v": 1, "kind": "decision", "value": cast(JSON, value)}  # (object(): not JSON)
    return {"call_1": ("decision:call_1", record)}


def test_the_first_answer_stands_and_another_is_refused_naming_the_pause(checkpointer: BaseCheckpointer) -> None:
    thread = "first-answers"
    run_sync(record_first_answers(checkpointer, thread, _answer(True)))
    again = run_sync(record_first_answers(checkpointer, thread, _answer(True)))
    assert again["decision:call_1"]["value"] is True
    with pytest.raises(InterruptDecidedError) as refused:
        run_sync(record_first_answers(checkpointer, thread, _answer(False)))
    assert (refused.value.interrupt_id, refused.value.recorded, refused.value.given) == ("call_1", True, False)
    stored = run_sync(checkpointer.aget_tool_results(thread, ["decision:call_1"]))
    assert stored["decision:call_1"]["value"] is True


def test_an_answer_recorded_by_another_writer_after_the_read_is_read_back_and_compared(
    checkpointer: BaseCheckpointer,
) -> None:
    thread = "first-answers-race"
    run_sync(record_first_answers(checkpointer, thread, _answer("no")))
    with pytest.raises(InterruptDecidedError):  # (read as if before the other writer's: its write loses)
        run_sync(record_first_answers(checkpointer, thread, _answer("yes"), found={}))


def test_an_answer_that_cannot_be_stored_is_an_error_naming_it(checkpointer: BaseCheckpointer) -> None:
    with pytest.raises(ConfigError, match="decision:call_1"):
        run_sync(record_first_answers(checkpointer, "first-answers-bad", _answer(object())))
