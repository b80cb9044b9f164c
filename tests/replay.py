"""Recorded real provider traffic (``tests/recorded/``, see its README for where each file comes from and its
licence), replayed through a local :class:`~tests.helpers.WireServer` into the official SDKs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import WireServer

RECORDED = Path(__file__).parent / "recorded"


def openai_capture(prefix: str) -> bytes:
    """An SSE capture of openai-python's, by the start of its name."""
    (path,) = (RECORDED / "openai-python").glob(f"{prefix}*.bin")
    return path.read_bytes()


def cassette(name: str) -> list[dict[str, Any]]:
    """The model interactions of a pydantic-ai cassette (``test_google/test_google_model_max_tokens``): each with
    the ``request`` body the real API got and the ``response`` (status, content type, body bytes) it sent."""
    data = yaml.safe_load((RECORDED / "pydantic-ai" / f"{name}.yaml").read_text())
    out = []
    for interaction in data["interactions"]:
        request, response = interaction["request"], interaction["response"]
        if "oauth2" in request["uri"]:  # Vertex's token exchange: not the model's traffic
            continue
        headers = {k.lower(): v[0] for k, v in response.get("headers", {}).items()}
        if "body" in response:
            body = response["body"]["string"].encode()
        else:
            body = json.dumps(response["parsed_body"]).encode()
        reply = {"status": response["status"]["code"], "content-type": headers.get("content-type"), "body": body}
        out.append({"request": request.get("parsed_body"), "uri": request["uri"], "response": reply})
    return out


def serve(wire: WireServer, *responses: dict[str, Any]) -> None:
    """Queue recorded responses on *wire*, in order."""
    for r in responses:
        wire.script.append((r["status"], {"content-type": r["content-type"] or "application/json"}, r["body"]))


def serve_sse(wire: WireServer, *captures: bytes) -> None:
    for capture in captures:
        wire.script.append((200, {"content-type": "text/event-stream"}, capture))
