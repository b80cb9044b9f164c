"""Google Gemini (google-genai SDK) as a ChatModel (optional ``google`` extra).

Conversion both ways: user/assistant/tool messages <-> ``contents`` of ``user``/``model`` parts (function calls and
function responses with their ids; system messages become the ``system_instruction``); tool schemas ->
function declarations. A reply's function calls keep the provider's ids as ``tool_call_id`` (calls without one get
``call_1``, ``call_2``... in order); the message always gets our own fresh ``message_id``. 429 and 5xx answers are
retried with backoff, honouring ``Retry-After`` (the SDK's own retries are switched off for this).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from tenxgraph.models.base import require_api_key
from tenxgraph.state.messages import JSON, Message, TextBlock, ToolCallBlock
from tenxgraph.utils.constants import install_hint
from tenxgraph.utils.errors import ProviderUnavailableError

API_KEY_ENVS = ("GOOGLE_API_KEY", "GEMINI_API_KEY")
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


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
                parts = [t.Part(text=m.text)] if m.text else []
                for c in m.tool_calls:
                    args = c.args if isinstance(c.args, dict) else {}
                    parts.append(t.Part(function_call=t.FunctionCall(id=c.id, name=c.name, args=args)))
                contents.append(t.Content(role="model", parts=parts))
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

    def from_response(self, response: Any) -> Message:
        blocks: list[TextBlock | ToolCallBlock] = []
        candidate = response.candidates[0] if response.candidates else None
        parts = candidate.content.parts if candidate is not None and candidate.content else []
        calls = 0
        for part in parts or []:
            if part.text:
                blocks.append(TextBlock(part.text))
            if part.function_call is not None:
                calls += 1
                call = part.function_call
                blocks.append(ToolCallBlock(call.id or f"call_{calls}", call.name or "", dict(call.args or {})))
        return Message(role="assistant", content=tuple(blocks), metadata={"provider": "google"})

    async def agenerate(self, messages: Sequence[Message], tools: Sequence[dict[str, JSON]]) -> Message:
        from google.genai import errors

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
        for attempt in range(self.max_retries + 1):
            try:
                response = await self.client.aio.models.generate_content(
                    model=self.model, contents=contents, config=config
                )
                return self.from_response(response)
            except errors.APIError as exc:
                if exc.code not in RETRY_STATUSES or attempt == self.max_retries:
                    raise
                await asyncio.sleep(retry_delay(exc, attempt))
        raise AssertionError("unreachable")
