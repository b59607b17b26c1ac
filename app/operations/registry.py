"""The operation table: every operation, its params and result types, its handler and the
errors it can answer, in one table that every face serves.

The JSON-RPC face dispatches on it (and ``rpc.discover`` documents every entry), the MCP face
lists it as tools, and the agent card lists ``registry.names()``: an operation added here
appears everywhere.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from app.scopes import SCOPES

if TYPE_CHECKING:
    from app.errors import CstpError

    from .context import CallContext

P = TypeVar("P")  # the params type the runner decodes
R = TypeVar("R")  # the result type the handler answers
# Called in a fresh transaction when a call of this operation fails (validation, rate limit,
# handler error), so audit tables can record how it ended.
FailureHook = Callable[["CallContext", dict[str, Any], "CstpError"], Awaitable[None]]


@dataclass(frozen=True)
class Operation(Generic[P, R]):
    """One operation; mypy holds its handler to its declared params and result types."""

    name: str
    params: type[P]
    result: type[R]  # the type of what the handler answers (a Struct)
    handler: Callable[[CallContext, P], Awaitable[R]]
    summary: str  # one line (OpenRPC summary)
    # For a model deciding when to call it: what it is for, when to call it, what it answers
    # (the MCP tool description and the OpenRPC description).
    description: str = ""
    # The scopes that let a token call it, any one of them (app.scopes); every operation
    # declares its own (``Registry.add`` refuses one without).
    scopes: tuple[str, ...] = ()
    writes: bool = True
    # False: the runner opens no transaction for the call; its handler reads in short
    # transactions of its own and hands its rows to a batched writer (app.batches), so the
    # call holds no transaction while it waits for the batch's.
    transaction: bool = True
    on_failure: FailureHook | None = None
    # Error codes this operation answers beyond those every one can (app.errors.COMMON).
    errors: tuple[int, ...] = ()
    # Its MCP tool name (snake_case); None: not offered as a tool (rpc.discover).
    tool: str | None = None
    # Params the tool leaves out of its input schema: informational ones that the token
    # decides (announceIntent's ``agent``), so the agent is never a tool argument.
    not_tool_arguments: tuple[str, ...] = ()


class Registry:
    def __init__(self) -> None:
        self._operations: dict[str, Operation[Any, Any]] = {}

    def add(self, operation: Operation[P, R]) -> None:
        if not operation.scopes or not set(operation.scopes) <= set(SCOPES):
            raise ValueError(f"operation {operation.name} must declare its scopes (app.scopes)")
        # Generic, not Operation[Any, Any]: that type context would let mypy infer Any for
        # the operation's types and so accept a handler that answers another type.
        if operation.name in self._operations:
            raise ValueError(f"operation {operation.name} registered twice")
        if operation.tool is not None and operation.tool in {o.tool for o in self.operations()}:
            raise ValueError(f"tool name {operation.tool} registered twice")
        self._operations[operation.name] = operation

    def get(self, name: str) -> Operation[Any, Any] | None:
        return self._operations.get(name)

    def names(self) -> list[str]:
        return sorted(self._operations)

    def operations(self) -> list[Operation[Any, Any]]:
        return [self._operations[name] for name in self.names()]

    def tools(self) -> list[Operation[Any, Any]]:
        """The operations offered as MCP tools, by tool name."""
        return sorted((o for o in self.operations() if o.tool), key=lambda o: o.tool or "")
