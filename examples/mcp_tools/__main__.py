import tempfile
from pathlib import Path

from examples.mcp_tools.agent import build_agent, ticket_server
from tenxgraph import Message

with tempfile.TemporaryDirectory() as folder, ticket_server(Path(folder) / "tickets.db") as session:
    result = build_agent(session).invoke({"messages": [Message.text_message("refund order 1042")]}, {"thread_id": "t1"})
    print(result.final_text)
    for message in result.messages:
        for answer in message.tool_results:
            print(" ", answer.output)
