"""Google Gemini (google-genai SDK) as a ChatModel (optional ``google`` extra).

Conversion both ways: user/assistant/tool messages <-> ``contents`` of ``user``/``model`` parts (function calls and
function responses with their ids; system messages become the ``system_instruction``); tool schemas ->
function declarations. The message always gets our own fresh ``message_id``. 429 and 5xx answers are retried with
backoff, honouring ``Retry-After`` (the SDK's own retries are switched off for this).

What Gemini sends that must survive the round trip:

- **Call ids**: the Gemini API sends function calls without ids; a call gets the provider's id if there is one,
  else ``call_1``, ``call_2``... by position in its message. Its ledger key stays stable all the same: the key is
  ``message_id:tool_call_id``, and the message id is ours, generated once and stored before any call runs.
- **Thought signatures** (Gemini 3 refuses a follow-up whose function call lost its ``thoughtSignature``): each
  part's signature is kept in ``metadata["thought_signatures"]`` (content block index -> base64) and goes back on
  the same part; with parallel calls only the first carries one, and only it gets it back.
- **Thought summaries** (``thought: true`` parts) are the model's reasoning, not its answer: they go to
  ``metadata["reasoning"]`` (and stream as reasoning chunks), never into the text, and are not sent back.
- **How it ended**: ``finishReason`` (``MAX_TOKENS`` -> ``length``, ``SAFETY``, ``MODEL_ARMOR`` and the other
  filters -> ``content_filter``, a malformed or unexpected call -> ``error``, any other value -> ``other``), a
  blocked prompt (``promptFeedback.blockReason`` -> ``blocked``, ``metadata["block_reason"]``) and the token
  counts (``usage``), as :mod:`tenxgraph.models.stream` describes.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from tenxgraph.models.base import require_api_key
from tenxgraph.models.stream import MessageChunk, ToolCallChunk, collect, ending, usage_of
from tenxgraph.state.messages import JSON, Message, TextBlock, ToolCallBlock, new_id
from tenxgraph.utils.constants import install_hint
from tenxgraph.utils.errors import ProviderUnavailableError

API_KEY_ENVS = ("GOOGLE_API_KEY", "GEMINI_API_KEY")
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
FINISH = {"STOP": "stop", "MAX_TOKENS": "length"}
#: A filter stopped the reply (Model Armor, the operator's screening, is one).
FILTERS = (
    "SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY", "LANGUAGE",
    "IMAGE_PROHIBITED_CONTENT", "IMAGE_RECITATION", "MODEL_ARMOR",
)  # fmt: skip
FINISH |= {name: "content_filter" for name in FILTERS}
#: The model could not produce a valid reply (a call it should not have made, too many, a lost signature).
ERRORS = (
    "MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL", "TOO_MANY_TOOL_CALLS", "MISSING_THOUGHT_SIGNATURE",
    "MALFORMED_RESPONSE",
)  # fmt: skip
FINISH |= {name: "error" for name in ERRORS}
#: Any other value (``OTHER``, ``IMAGE_OTHER``, ``NO_IMAGE``, one the SDK does not know yet) is ``other``: never
#: taken for a finished answer.


def retry_delay(exc: Exception, attempt: int, cap: float = 8.0) -> float:
    """Seconds to wait: the server's ``Retry-After`` when it sent one, else exponential backoff."""
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    value = headers.get("retry-after") if hasattr(headers, "get") else None
    if value is not None:
        try:
            return max(0.0, min(float(value), 60.0))
        except ValueError:
            pass
    return float(min(cap, 0.5 * 2**attempt))


class GoogleChatModel:
    #: The provider, as OpenTelemetry's GenAI conventions name it (``gen_ai.provider.name``).
    provider = "gcp.gemini"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int = 4,
        **config: Any,
    ) -> None:
        try:
            from google import genai
            from google.genai import types
        except ImportError as exc:
            raise ProviderUnavailableError(
                f'provider "google" needs the google extra: {install_hint("google")} ({exc})'
            ) from exc
        key = require_api_key("google", model, api_key, API_KEY_ENVS)
        self.types = types
        self.model = model
        self.max_retries = max_retries
        self.stream = bool(config.pop("stream", False))
        self.config = config
        http = types.HttpOptions(base_url=base_url, retry_options=types.HttpRetryOptions(attempts=1))
        self.client = genai.Client(api_key=key, http_options=http)

    def to_contents(self, messages: Sequence[Message]) -> tuple[list[Any], str | None]:
        t = self.types
        contents: list[Any] = []
        system: list[str] = []
        previous_was_tool = False
        for m in messages:
            if m.role == "system":
                system.append(m.text)
            elif m.role == "user":
                contents.append(t.Content(role="user", parts=[t.Part(text=m.text)]))
            elif m.role == "assistant":
                contents.append(t.Content(role="model", parts=self.model_parts(m)))
            else:
                name = str(m.metadata.get("tool", ""))
                parts = [
                    t.Part(
                        function_response=t.FunctionResponse(
                            id=r.call_id, name=name, response={"error" if r.is_error else "output": r.output}
                        )
                    )
                    for r in m.tool_results
                ]
                if previous_was_tool:  # all results of one model turn travel in one content, as Gemini expects
                    contents[-1].parts.extend(parts)
                else:
                    contents.append(t.Content(role="user", parts=parts))
            previous_was_tool = m.role == "tool"
        return contents, "\n\n".join(system) or None

    def model_parts(self, message: Message) -> list[Any]:
        """An assistant message's parts, each content block's thought signature back on its own part."""
        t = self.types
        signatures = (
            message.metadata.get("thought_signatures") if message.metadata.get("provider") == "google" else None
        )
        parts = []
        for index, block in enumerate(message.content):
            signature = signatures.get(str(index)) if isinstance(signatures, dict) else None
            extra = {"thought_signature": base64.b64decode(signature)} if isinstance(signature, str) else {}
            if isinstance(block, TextBlock) and (block.text or extra):
                parts.append(t.Part(text=block.text, **extra))
            elif isinstance(block, ToolCallBlock):
                args = block.args if isinstance(block.args, dict) else {}
                parts.append(t.Part(function_call=t.FunctionCall(id=block.id, name=block.name, args=args), **extra))
        return parts

    def from_response(self, response: Any) -> Message:
        reply = GeminiReply()
        reply.add(response)
        return reply.message()

    def _request(self, messages: Sequence[Message], tools: Sequence[dict[str, JSON]]) -> dict[str, Any]:
        t = self.types
        contents, system = self.to_contents(messages)
        declarations = [
            t.FunctionDeclaration(
                name=s["name"], description=s.get("description", ""), parameters_json_schema=s["parameters"]
            )
            for s in tools
        ]
        config = t.GenerateContentConfig(
            system_instruction=system,
            tools=[t.Tool(function_declarations=declarations)] if declarations else None,
            **self.config,
        )
        return {"model": self.model, "contents": contents, "config": config}

    async def agenerate(self, messages: Sequence[Message], tools: Sequence[dict[str, JSON]]) -> Message:
        if self.stream:
            return await collect(self.astream(messages, tools))
        request = self._request(messages, tools)
        response = await self._retrying(lambda: self.client.aio.models.generate_content(**request))
        return self.from_response(response)

    async def astream(
        self, messages: Sequence[Message], tools: Sequence[dict[str, JSON]]
    ) -> AsyncIterator[MessageChunk | Message]:
        """The reply's chunks as Gemini streams them (``streamGenerateContent``), then the message. Opening the
        stream is retried like a call; once chunks have come, an error ends the turn (the node fails, a resume
        asks again)."""
        request = self._request(messages, tools)
        reply = GeminiReply()
        stream = await self._retrying(lambda: self.client.aio.models.generate_content_stream(**request))
        async for response in stream:
            for piece in reply.add(response):
                yield piece
        yield reply.message()

    async def _retrying(self, call: Any) -> Any:
        from google.genai import errors

        for attempt in range(self.max_retries + 1):
            try:
                return await call()
            except errors.APIError as exc:
                if exc.code not in RETRY_STATUSES or attempt == self.max_retries:
                    raise
                await asyncio.sleep(retry_delay(exc, attempt))
        raise AssertionError("unreachable")


class GeminiReply:
    """One reply's parts, joined over the chunks of a stream (or from one response): text parts that follow each
    other make one text block, each function call a block of its own, with its signature by block index."""

    def __init__(self) -> None:
        self.message_id = new_id()
        self.blocks: list[TextBlock | ToolCallBlock] = []
        self.text: list[str] = []  # the text block being built
        self.signatures: dict[str, str] = {}
        self.reasoning: list[str] = []
        self.finish: str | None = None
        self.usage: dict[str, JSON] = {}
        self.block_reason: str | None = None
        self.model: str | None = None
        self.calls = 0

    def add(self, response: Any) -> list[MessageChunk]:
        out: list[MessageChunk] = []
        self.model = getattr(response, "model_version", None) or self.model
        if (usage := getattr(response, "usage_metadata", None)) is not None:
            self.usage = usage_of(
                usage.prompt_token_count, usage.candidates_token_count, usage.total_token_count,
                usage.thoughts_token_count,
            )  # fmt: skip
        feedback = getattr(response, "prompt_feedback", None)
        if feedback is not None and feedback.block_reason is not None:
            self.block_reason = _name(feedback.block_reason)
        candidate = response.candidates[0] if response.candidates else None
        if candidate is None:
            return out
        if candidate.finish_reason is not None:
            self.finish = _name(candidate.finish_reason)
        for part in (candidate.content.parts if candidate.content else None) or []:
            out.extend(self._part(part))
        return out

    def _part(self, part: Any) -> list[MessageChunk]:
        signature = base64.b64encode(part.thought_signature).decode() if part.thought_signature else None
        if part.text and part.thought:
            self.reasoning.append(part.text)
            return [MessageChunk(self.message_id, reasoning=part.text)]
        if part.function_call is not None:
            self._close_text()
            self.calls += 1
            call = part.function_call
            block = ToolCallBlock(call.id or f"call_{self.calls}", call.name or "", dict(call.args or {}))
            if signature is not None:
                self.signatures[str(len(self.blocks))] = signature
            self.blocks.append(block)
            args = ToolCallChunk(self.calls - 1, block.id, block.name, json.dumps(block.args))
            return [MessageChunk(self.message_id, tool_call=args)]
        if part.text or signature is not None:
            if signature is not None:  # (a signature on a text part: kept with the text block it belongs to)
                self.signatures[str(len(self.blocks))] = signature
            self.text.append(part.text or "")
            return [MessageChunk(self.message_id, text=part.text)] if part.text else []
        return []

    def _close_text(self) -> None:
        # (a signature may come on an empty text part, the last chunk of a stream: its block is kept to carry it back)
        if "".join(self.text) or str(len(self.blocks)) in self.signatures:
            self.blocks.append(TextBlock("".join(self.text)))
        self.text = []

    def message(self) -> Message:
        self._close_text()
        has_calls = any(isinstance(b, ToolCallBlock) for b in self.blocks)
        reason = FINISH.get(self.finish, "other") if self.finish is not None else None
        if reason == "stop" and has_calls:
            reason = "tool_calls"
        if self.block_reason is not None:
            reason = "blocked"
        extra: dict[str, JSON] = {"usage": self.usage, "model": self.model, "reasoning": "".join(self.reasoning)}
        extra |= {"thought_signatures": self.signatures, "block_reason": self.block_reason}
        metadata = ending("google", reason, self.finish, extra)
        return Message(role="assistant", content=tuple(self.blocks), message_id=self.message_id, metadata=metadata)


def _name(value: Any) -> str:
    """An SDK enum's name (``FinishReason.MAX_TOKENS`` -> ``MAX_TOKENS``), or the string itself."""
    return str(getattr(value, "name", value))
