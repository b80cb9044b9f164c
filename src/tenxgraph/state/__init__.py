"""Messages and graph state."""

from tenxgraph.state.messages import (
    ContentBlock,
    Message,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    new_id,
)
from tenxgraph.state.state import AgentState, ExecutionMeta

__all__ = [
    "AgentState",
    "ContentBlock",
    "ExecutionMeta",
    "Message",
    "TextBlock",
    "ToolCallBlock",
    "ToolResultBlock",
    "new_id",
]
