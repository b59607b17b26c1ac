"""What a handler gets for one call: who is calling, its transaction, the services."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncSession

from app.scopes import Principal

if TYPE_CHECKING:
    from app.observability.calls import CallSpan
    from app.services import Services


CONSOLE = "console"  # the face of a person signed in to the console (app.console)


@dataclass
class CallContext:
    principal: Principal  # who calls: the token's agent, workspace and scopes
    method: str
    services: Services
    # The call's transaction; None for an operation that commits in batches of its own
    # (``Operation.transaction``), whose reads each take a short one.
    open_session: AsyncSession | None
    after_commit: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    # Which face the call came through: jsonrpc, mcp or console (a person's click, whose
    # review is source ``human``).
    face: str = "jsonrpc"
    # The call's span while tracing is on (app.observability.tracing); None when it is off.
    span: CallSpan | None = None

    @property
    def agent(self) -> str:
        """The calling agent: always the one its token names."""
        return self.principal.agent

    @property
    def workspace(self) -> str:
        """The calling token's workspace: every row the call reads or writes is of it."""
        return self.principal.workspace

    @property
    def session(self) -> AsyncSession:
        """The call's transaction (an operation without one must not ask for it)."""
        if self.open_session is None:
            raise RuntimeError(f"{self.method} runs without a transaction of its own")
        return self.open_session

    def on_commit(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Run ``callback`` once this call's transaction has committed (outside effects)."""
        self.after_commit.append(callback)

    def trace(self, key: str, value: str | bool | int | float) -> None:
        """Put ``key`` on the call's span (nothing when tracing is off)."""
        if self.span is not None:
            self.span.set(key, value)

    def trace_row(self, table: str, row_id: str) -> None:
        """Name the audit row this call wrote on its span, and its chain entry's sequence
        number once committed (nothing when tracing is off)."""
        if self.span is not None:
            self.span.row(table, row_id)

    def trace_text(self, key: str, text: str | None) -> None:
        """A text the caller sent (intent, query, decision), on the span only when
        CSTP_TRACE_CONTENT is on."""
        if self.span is not None:
            self.span.text(key, text)
