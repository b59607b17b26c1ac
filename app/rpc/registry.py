"""The method registry: every RPC method, its params and result types, its handler and the
errors it can answer, in one table.

The agent card lists ``registry.names()`` and ``rpc.discover`` documents every entry, so a
method registered here is advertised and documented.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .context import CallContext
    from .errors import RpcError

Handler = Callable[["CallContext", Any], Awaitable[Any]]
# Called in a fresh transaction when a call of this method fails (validation, rate limit,
# handler error), so audit tables can record how it ended.
FailureHook = Callable[["CallContext", dict[str, Any], "RpcError"], Awaitable[None]]


@dataclass(frozen=True)
class Method:
    name: str
    params: type[Any]
    result: Any  # the type of what the handler answers (a Struct, or dict[str, Any])
    handler: Handler
    summary: str
    writes: bool = True
    on_failure: FailureHook | None = None
    # Error codes this method answers beyond those every method can (app.rpc.errors.COMMON).
    errors: tuple[int, ...] = ()


class Registry:
    def __init__(self) -> None:
        self._methods: dict[str, Method] = {}

    def add(self, method: Method) -> None:
        if method.name in self._methods:
            raise ValueError(f"method {method.name} registered twice")
        self._methods[method.name] = method

    def get(self, name: str) -> Method | None:
        return self._methods.get(name)

    def names(self) -> list[str]:
        return sorted(self._methods)

    def methods(self) -> list[Method]:
        return [self._methods[name] for name in self.names()]
