"""ReactAgent: model node ``MAIN`` and tool node ``TOOL``, looping until the assistant asks for no tool."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from tenxgraph.core.graph.compiled import CompiledGraph
from tenxgraph.core.graph.state_graph import StateGraph
from tenxgraph.core.graph.tool_node import ToolNode
from tenxgraph.core.tools.tool import Tool
from tenxgraph.models.base import ChatModel
from tenxgraph.models.calls import generate
from tenxgraph.models.registry import resolve_model
from tenxgraph.state.messages import Message
from tenxgraph.state.state import AgentState
from tenxgraph.storage.checkpointer.base import BaseCheckpointer
from tenxgraph.utils.constants import END
from tenxgraph.utils.errors import ConfigError

S = TypeVar("S", bound=AgentState)
MAIN = "MAIN"
TOOL = "TOOL"


def system_prompt_texts(system_prompt: object) -> list[str]:
    """The texts of a system prompt given as a string, a list of strings, or a list of role/content dicts; a
    :class:`ConfigError` naming the item otherwise (the first model call used to fail with a TypeError)."""
    if isinstance(system_prompt, str):
        return [system_prompt]
    if not isinstance(system_prompt, Sequence):
        raise ConfigError(f"system_prompt must be a string or a list, got {type(system_prompt).__name__}")
    texts = []
    for i, item in enumerate(system_prompt):
        if isinstance(item, str):
            texts.append(item)
        elif (
            isinstance(item, Mapping)
            and item.get("role", "system") == "system"
            and isinstance(item.get("content"), str)
        ):
            if set(item) - {"role", "content"}:
                raise ConfigError(f"system_prompt[{i}] has keys {sorted(item)}; use only 'role' and 'content'")
            texts.append(item["content"])
        else:
            raise ConfigError(
                f"system_prompt[{i}] is {item!r}; give a string or {{'role': 'system', 'content': '...'}}"
            )
    return texts


class ReactAgent(Generic[S]):
    def __init__(
        self,
        model: str | ChatModel,
        provider: str | None = None,
        system_prompt: str | Sequence[str | Mapping[str, str]] = (),
        tools: Sequence[Callable[..., Any] | Tool] = (),
        state_schema: type[S] = AgentState,  # type: ignore[assignment]
        model_options: dict[str, Any] | None = None,
    ) -> None:
        """``system_prompt``: a string, a list of strings, or a list of ``{"role": "system", "content": "..."}``
        dicts. ``model_options`` go to the provider (e.g. ``{"base_url": ..., "api_key": ...}``)."""
        prompts = system_prompt_texts(system_prompt)  # checked before the model is resolved: the clearer error
        self.model = resolve_model(model, provider, **(model_options or {}))
        self.system_messages = [Message.system(p, message_id=f"system_{i}") for i, p in enumerate(prompts)]
        self.tool_node = ToolNode(tools)
        self.state_schema = state_schema

    async def _main(self, state: AgentState) -> dict[str, Any]:
        """The model node: its reply streams to a caller that asks for tokens (see :func:`generate`)."""
        reply = await generate(self.model, [*self.system_messages, *state.messages], self.tool_node.schemas())
        return {"messages": [reply]}

    @staticmethod
    def _route(state: AgentState) -> str:
        last = state.last_message
        return TOOL if last is not None and last.role == "assistant" and last.tool_calls else END

    def graph(self) -> StateGraph[S]:
        graph: StateGraph[S] = StateGraph(self.state_schema)
        graph.add_node(MAIN, self._main)
        graph.add_node(TOOL, self.tool_node)
        graph.set_entry_point(MAIN)
        graph.add_conditional_edges(MAIN, self._route)
        graph.add_edge(TOOL, MAIN)
        return graph

    def compile(
        self, checkpointer: BaseCheckpointer | None = None, *, on_in_doubt: str | None = None
    ) -> CompiledGraph[S]:
        """The agent's graph over *checkpointer*; *on_in_doubt*: the default policy of its tools (see
        :meth:`tenxgraph.StateGraph.compile`)."""
        return self.graph().compile(checkpointer=checkpointer, on_in_doubt=on_in_doubt)
