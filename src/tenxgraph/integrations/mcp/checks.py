"""What an MCP server's tool may bring in, checked: its arguments against its input schema with a JSON Schema
library (the SDK's own dependency; a schema the library refuses never crashes the tool node), and caps on what
reaches the model and the ledger: a schema, a description (marked as the server's text), a result."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from tenxgraph.ledger import ToolOutput
from tenxgraph.state.messages import JSON
from tenxgraph.utils.constants import LOGGER_NAME
from tenxgraph.utils.errors import ConfigError

log = logging.getLogger(f"{LOGGER_NAME}.mcp")

#: A tool's input schema is sent with every model call: a larger one is refused when the tools are made.
MAX_SCHEMA_BYTES = 64 * 1024
#: A description is the server's text that the model reads as instructions: cut here, and marked as the server's.
MAX_DESCRIPTION_CHARS = 1024
#: A result larger than this is answered with an error (neither recorded nor sent to the model whole).
MAX_RESULT_BYTES = 1024 * 1024


def argument_checker(tool: str, server: str, schema: dict[str, JSON]) -> Callable[[dict[str, JSON]], list[str]] | None:
    """A JSON Schema validator of *schema* as a tool's ``validate`` (the problems, in words a model can act on), or
    None when the library refuses the schema itself: then the runtime's own total checks judge the arguments, and
    a WARNING names the tool."""
    from jsonschema import exceptions, validators

    cls = validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except exceptions.SchemaError as exc:
        log.warning("MCP tool %r of server %r has an invalid input schema (%s): its arguments get basic checks only",
                    tool, server, exc.message)  # fmt: skip
        return None
    validator = cls(schema)

    def validate(arguments: dict[str, JSON]) -> list[str]:
        problems = []
        for error in sorted(validator.iter_errors(arguments), key=lambda e: [str(p) for p in e.absolute_path]):
            where = ".".join(str(p) for p in error.absolute_path)
            problems.append(f"argument {where}: {error.message}" if where else error.message)
        return problems

    return validate


def checked_schema(tool: str, server: str, schema: dict[str, JSON]) -> dict[str, JSON]:
    size = len(json.dumps(schema))
    if size > MAX_SCHEMA_BYTES:
        raise ConfigError(
            f"MCP tool {tool!r} of server {server!r} has an input schema of {size} bytes, over the cap of "
            f"{MAX_SCHEMA_BYTES} (it would be sent with every model call): leave it out with mcp_tools(..., only=...)"
        )
    return schema


def description(text: str | None, server: str, tool: str) -> str:
    """The description the model reads: the server's text, cut at :data:`MAX_DESCRIPTION_CHARS`, said to be the
    server's (text a server injects reaches the model as the server's words, not ours)."""
    said = (text or "").strip() or f"the {tool} tool"
    if len(said) > MAX_DESCRIPTION_CHARS:
        said = said[: MAX_DESCRIPTION_CHARS - 1] + "…"
    return f"[MCP server {server!r}] {said}"


def capped(output: ToolOutput, tool: str, server: str) -> ToolOutput:
    """*output*, or an error answer when it is larger than :data:`MAX_RESULT_BYTES`."""
    size = len(json.dumps(output.content, default=str))
    if size <= MAX_RESULT_BYTES:
        return output
    return ToolOutput(
        f"the result of MCP tool {tool!r} of server {server!r} is {size} bytes, over the cap of {MAX_RESULT_BYTES}: "
        "it was not kept (ask the server for less)",
        is_error=True,
    )
