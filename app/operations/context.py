"""What a handler gets for one call: who is calling, its transaction, the services."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncSession

if TYPE_CHECKING:
    from app.services import Services


@dataclass
class CallContext:
    agent: str
    method: str
    services: Services
    session: AsyncSession
    after_commit: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def on_commit(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Run ``callback`` once this call's transaction has committed (outside effects)."""
        self.after_commit.append(callback)
