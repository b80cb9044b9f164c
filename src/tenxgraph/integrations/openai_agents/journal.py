"""The model's responses, journaled: :class:`JournaledModel` wraps the agent's ``agents.Model`` for one run.

A response is recorded in the ledger's store, in the run's thread, under ``model-response:{run_id}:{n}`` (*n*:
how many input items the request carries: the same on every replay of the run, and growing with every turn).
Recorded: the response is answered from the record, and the model is not asked; its function calls come back
with the same item ids and ``call_id``\\s, so the ledger finds their records. First write wins: two processes
resuming one run go on with the response recorded first. Each record keeps a digest of the run's first input
item: a resume given another input is refused (``ConfigError``), not answered with the first input's turns.
A replayed turn reports no usage (nothing was spent on it again).

A streamed run (``Runner.run_streamed``) is journaled the same way: the model's events pass through as they come,
and its response is recorded before the event that completes it reaches the runner (so before any of its calls
runs); a replayed turn streams that one completed event, with the recorded output, and no deltas."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

from agents.items import ModelResponse, TResponseOutputItem, TResponseStreamEvent
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import Response, ResponseCompletedEvent, ResponseOutputItemDoneEvent
from pydantic import TypeAdapter

from tenxgraph.ledger import LedgerStore, probe
from tenxgraph.state.messages import JSON
from tenxgraph.utils.errors import ConfigError

__all__ = ["JournaledModel", "model_key"]

_OUTPUT = TypeAdapter(TResponseOutputItem)


def model_key(run_id: str, input: str | list[Any]) -> str:
    """The journal key of the request run *run_id* makes with *input*."""
    return f"model-response:{run_id}:{1 if isinstance(input, str) else len(input)}"


def input_fingerprint(input: str | list[Any]) -> str:
    """What a run's journal keeps of its input: a digest of its first item (the user's request)."""
    first = input if isinstance(input, str) else (input[0] if input else None)
    text = first if isinstance(first, str) else json.dumps(first, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class JournaledModel(Model):
    """*inner*, with its responses journaled in *ledger* on *thread* for run *run_id* (see the module)."""

    def __init__(self, inner: Model, ledger: LedgerStore, thread: str, run_id: str) -> None:
        self.inner, self.ledger, self.thread, self.run_id = inner, ledger, thread, run_id

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        key, prompt = model_key(self.run_id, input), input_fingerprint(input)
        found = (await self.ledger.aget_tool_results(self.thread, [key])).get(key)
        if found is not None:
            return self._replayed(found, prompt)
        response = await self.inner.get_response(system_instructions, input, *args, **kwargs)
        return await self._record(key, response, prompt) or response

    async def stream_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> AsyncIterator[TResponseStreamEvent]:
        key, prompt = model_key(self.run_id, input), input_fingerprint(input)
        found = (await self.ledger.aget_tool_results(self.thread, [key])).get(key)
        if found is not None:
            yield completed(self._replayed(found, prompt))
            return
        done: list[TResponseOutputItem] = []  # (some providers complete with an empty output, items sent before)
        async for event in self.inner.stream_response(system_instructions, input, *args, **kwargs):
            if isinstance(event, ResponseOutputItemDoneEvent):
                done.append(event.item)
            if not isinstance(event, ResponseCompletedEvent):
                yield event
                continue
            output = list(event.response.output) or done
            response = ModelResponse(output=output, usage=Usage(), response_id=event.response.id)
            winner = await self._record(key, response, prompt)
            yield event if winner is None else completed(winner)

    async def _record(self, key: str, response: ModelResponse, prompt: str) -> ModelResponse | None:
        """Record *response* under *key*: None when it was recorded, else the response another resumer recorded
        first (the one to go on with)."""
        probe.point("openai_agents.after_model_response")
        record: dict[str, JSON] = {
            "v": 1,
            "kind": "model_response",
            "output": [item.model_dump(mode="json", exclude_none=True) for item in response.output],
            "response_id": response.response_id,
            "prompt": prompt,
        }
        if await self.ledger.aput_tool_result(self.thread, key, record):
            probe.point("openai_agents.after_model_record")
            return None
        winner = (await self.ledger.aget_tool_results(self.thread, [key]))[key]
        return self._replayed(winner, prompt)

    def _replayed(self, record: dict[str, Any], prompt: str) -> ModelResponse:
        if record.get("prompt") != prompt:
            raise ConfigError(
                f"OpenAI Agents SDK run {self.run_id!r} was started with another input than this one, and its "
                "journal holds that run's model turns: resume a run with the input it was started with, or start "
                "a new run with another run_id"
            )
        output = [_OUTPUT.validate_python(item) for item in record["output"]]
        return ModelResponse(output=output, usage=Usage(), response_id=record.get("response_id"))

    async def close(self) -> None:
        await self.inner.close()


def completed(response: ModelResponse) -> ResponseCompletedEvent:
    """The stream event that completes a recorded *response* (what a replayed streamed turn sends)."""
    done = Response(
        id=response.response_id or "replayed", created_at=0.0, model="replayed", object="response",
        output=list(response.output), parallel_tool_calls=True, tool_choice="auto", tools=[],
    )  # fmt: skip
    return ResponseCompletedEvent(response=done, sequence_number=0, type="response.completed")
