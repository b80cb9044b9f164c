"""Ready-made graphs."""

from tenxgraph.prebuilt.agent import ReactAgent

__all__ = ["ReactAgent"]
