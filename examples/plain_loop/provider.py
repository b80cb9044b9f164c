"""A scripted OpenAI endpoint for the offline example: the official ``openai`` SDK runs its real request and
parsing code against an ``httpx.MockTransport`` that answers ``POST /chat/completions`` as a model would. Each
answer has fresh ids, as a real provider's do: a loop that asked the model again after a crash gets new calls."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx

FINAL = "I refunded order A-1042 and emailed the customer."


def _completion(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": 1_790_000_000,
        "model": "gpt-scripted",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
    }


def _call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}  # fmt: skip


def answer(request: httpx.Request) -> httpx.Response:
    """The model: a user's request gets two parallel calls (refund, email); their results get the final answer."""
    if request.url.path != "/v1/chat/completions":
        return httpx.Response(404, json={"error": {"message": f"no route {request.url.path}"}})
    messages = json.loads(request.content)["messages"]
    if messages[-1]["role"] == "tool":
        return httpx.Response(200, json=_completion({"role": "assistant", "content": FINAL}))
    calls = [
        _call("refund_order", {"order_id": "A-1042", "amount": 20.0}),
        _call("send_email", {"to": "ada@example.com", "subject": "Your refund"}),
    ]
    return httpx.Response(200, json=_completion({"role": "assistant", "content": None, "tool_calls": calls}))


def scripted_client() -> Any:
    """An ``openai.AsyncOpenAI`` whose requests the scripted model answers (no network)."""
    from openai import AsyncOpenAI

    transport = httpx.MockTransport(answer)
    return AsyncOpenAI(api_key="offline", base_url="https://api.openai.test/v1",
                       http_client=httpx.AsyncClient(transport=transport))  # fmt: skip
