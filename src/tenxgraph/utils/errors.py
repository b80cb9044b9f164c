"""Every error the runtime raises on purpose. Each message names the thing at fault and the fix."""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "GraphBuildError",
    "GraphRecursionError",
    "IntentWriteError",
    "InterruptDecidedError",
    "LedgerReadError",
    "NodeTimeoutError",
    "ProviderUnavailableError",
    "RunLockLostError",
    "SerializationError",
    "StaleStateError",
    "StorageConnectionError",
    "TenxGraphError",
    "ThreadBusyError",
    "ToolTimeoutError",
    "ToolUnavailableError",
    "UnknownProviderError",
]


class TenxGraphError(Exception):
    """Base class of the runtime's own errors."""


class ConfigError(TenxGraphError, ValueError):
    """A run config or constructor argument is invalid."""


class GraphBuildError(TenxGraphError, ValueError):
    """The graph definition is inconsistent (unknown node, no entry point, ...)."""


class GraphRecursionError(TenxGraphError, RecursionError):
    """A run took more steps than its ``recursion_limit``."""

    @classmethod
    def stopped(cls, thread_id: str, steps: int, limit: int, node: str) -> GraphRecursionError:
        return cls(
            f"thread {thread_id!r} ran {steps} nodes without finishing (recursion_limit={limit}); it stopped before "
            f"node {node!r} and stays resumable: check the graph for a loop, or resume with "
            "invoke(None, {'thread_id': ..., 'recursion_limit': N})"
        )


class NodeTimeoutError(TenxGraphError, TimeoutError):
    """A node ran longer than its ``node_timeout``."""

    def __init__(self, node: str, limit: float) -> None:
        self.node = node
        self.limit = limit
        super().__init__(
            f"node {node!r} did not finish within node_timeout={limit:g}s; raise the limit with "
            f"config={{'node_timeout': ...}} or disable it with None"
        )


class ToolTimeoutError(TenxGraphError, TimeoutError):
    """A tool ran longer than its ``tool_timeout``. The model sees it as an error tool result."""

    def __init__(self, tool: str, limit: float) -> None:
        self.tool = tool
        self.limit = limit
        super().__init__(f"tool {tool!r} did not finish within tool_timeout={limit:g}s and was cancelled")


class StaleStateError(TenxGraphError):
    """A versioned state write lost a compare-and-swap: another run wrote the thread first."""

    def __init__(self, thread_id: str, expected: int, actual: int | None) -> None:
        self.thread_id = thread_id
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"thread {thread_id!r}: state write expected version {expected} but storage holds version "
            f"{actual}; another run wrote this thread concurrently. Reload the thread and resume it."
        )


class ThreadBusyError(StaleStateError):
    """Another run holds the thread right now (a client retry, a second worker): nothing was run or written."""

    def __init__(
        self, thread_id: str, waited: float | None = None, holder: str | None = None, retry_after: float | None = None
    ) -> None:
        self.thread_id = thread_id
        self.expected = 0
        self.actual = None
        self.waited = waited
        #: Who holds the thread, when the storage knows (a lease's holder), and how many seconds until it may be
        #: free at the latest if that holder stops renewing.
        self.holder = holder
        self.retry_after = retry_after
        how = f" (waited {waited:g}s for it)" if waited else ""
        who = f": {holder}" if holder else ""
        TenxGraphError.__init__(
            self,
            f"thread {thread_id!r} is being run by another worker right now{how}{who}; nothing was run. Retry when "
            "that run has finished, or pass config={'lock_timeout': seconds} to wait (a run's lock is released when "
            "it ends or its process dies)",
        )


class RunLockLostError(StaleStateError):
    """This run no longer holds its thread's run lock (its database connection was dropped): it stopped before
    invoking another tool or writing state, so a run that took the thread over cannot be raced. The thread stays
    resumable."""

    def __init__(self, thread_id: str, reason: str) -> None:
        self.thread_id = thread_id
        self.expected = 0
        self.actual = None
        TenxGraphError.__init__(
            self,
            f"thread {thread_id!r}: this run lost its run lock ({reason}) and stopped before running anything "
            "else; the thread stays resumable: invoke it again (with a lock_timeout) to finish it",
        )


class ToolUnavailableError(TenxGraphError, ConnectionError):
    """What runs a tool could not be reached, or went away during a call (an MCP server that would not start, or
    exited): no answer is recorded, the node fails, and the thread stays resumable (a resume reconnects; a call
    whose outcome is unknown is then in doubt, or runs again as its effect class says)."""


class StorageConnectionError(TenxGraphError, ConnectionError):
    """The database could not be reached, or refused us, within the retry budget; the message has its reason."""


class IntentWriteError(TenxGraphError):
    """A tool with an in-doubt policy was not run because its intent record could not be written."""

    def __init__(self, tool: str, key: str, thread_id: str, cause: BaseException) -> None:
        self.tool, self.key, self.thread_id = tool, key, thread_id
        super().__init__(
            f"tool {tool!r} (key {key!r}, thread {thread_id!r}) was not run: its intent record could not be written "
            f"({type(cause).__name__}: {cause}). A tool with on_in_doubt never runs without one, or a crash during "
            "it could not be detected; the thread stays resumable: fix the storage and invoke it again"
        )


class LedgerReadError(TenxGraphError):
    """The ledger could not be read for a message with calls of tools that have an in-doubt policy."""

    def __init__(self, tools: list[str], thread_id: str, cause: BaseException) -> None:
        self.tools, self.thread_id = tools, thread_id
        super().__init__(
            f"thread {thread_id!r}: the ledger could not be read ({type(cause).__name__}: {cause}), and tool(s) "
            f"{', '.join(map(repr, tools))} have an in-doubt policy: they never run without knowing whether they "
            "ran, so no call of the message ran; the thread stays resumable: invoke it again"
        )


class TransactionEndedError(TenxGraphError):
    """A transactional tool's body sent a statement after its transaction ended: it was not run."""

    def __init__(self) -> None:
        super().__init__(
            "a statement of a transactional tool's body came after the call's transaction ended (committed with "
            "its ledger record, or rolled back: the run was cancelled or crashed while the body ran in a thread of "
            "its own): it was not run, as it would have been written outside the transaction. Write only from the "
            "body while it runs, and return once its writes are done"
        )


class InterruptDecidedError(ConfigError):
    """A Resume gave an interrupt a decision other than the one recorded for it: one decision per interrupt, ever.
    (The same decision again is answered as the thread stands: nothing runs twice.)"""

    def __init__(self, thread_id: str, interrupt_id: str, recorded: object, given: object) -> None:
        self.thread_id, self.interrupt_id, self.recorded, self.given = thread_id, interrupt_id, recorded, given
        super().__init__(
            f"thread {thread_id!r}: interrupt {interrupt_id!r} was already decided ({recorded!r}); a second, "
            f"different decision ({given!r}) is refused and nothing ran. Send the recorded decision again to get "
            "the thread's result, or start a new request"
        )


class SerializationError(TenxGraphError, TypeError):
    """A value that must be stored is not JSON-serialisable."""


class UnknownProviderError(TenxGraphError, LookupError):
    """A model provider name is not registered."""


class ProviderUnavailableError(TenxGraphError, ImportError):
    """A registered model provider cannot be used on this install."""


for _name in __all__:  # tracebacks and pickles name the public home, tenxgraph.errors
    globals()[_name].__module__ = "tenxgraph.errors"
