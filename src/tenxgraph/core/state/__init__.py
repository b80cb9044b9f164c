"""Messages and graph state."""

from tenxgraph.core.state.messages import (
    ContentBlock,
    Message,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    new_id,
)
from tenxgraph.core.state.state import AgentState, ExecutionMeta

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
