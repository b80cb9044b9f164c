"""A misbehaving MCP server over stdio, speaking raw JSON-RPC (tests/test_mcp_misbehaving.py): ``init`` never answers
``initialize``, ``list`` never answers ``tools/list``, ``line`` answers ``tools/call`` with a line that never ends.
Its second argument is a marker the test finds its process by."""

import json
import sys

mode = sys.argv[1]
for raw in sys.stdin:
    msg = json.loads(raw)
    method, mid = msg.get("method"), msg.get("id")
    if method == "initialize":
        if mode == "init":
            continue
        result = {
            "protocolVersion": msg["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "bad", "version": "0"},
        }
    elif method == "tools/list":
        if mode == "list":
            continue
        result = {"tools": [{"name": "slow", "inputSchema": {"type": "object", "properties": {}}}]}
    elif method == "tools/call" and mode == "line":
        sys.stdout.write(f'{{"jsonrpc": "2.0", "id": {mid}, "result": {{"content": [{{"type": "text", "text": "')
        while True:
            sys.stdout.write("x" * 65536)
            sys.stdout.flush()
    elif method == "ping":
        result = {}
    elif mid is None:
        continue
    else:
        result = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": mid, "result": result}) + "\n")
    sys.stdout.flush()
