"""The method registry: every RPC method, its params struct and its handler, in one table.

The agent card lists ``registry.names()``, so a method registered here is advertised.
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
    handler: Handler
    writes: bool = True
    on_failure: FailureHook | None = None


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
