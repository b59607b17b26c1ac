"""Console sign-ins (SPEC.md, section 10): one row per session, so that signing out, or
the token's revocation, ends it in every server process at once.

The cookie holds a random session secret; the row is keyed by its SHA-256, so the table
never holds what the cookie holds. It holds the SHA-256 of the token signed in with (never
the token), looked up again on every request: a revoked or expired token ends its sessions.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, UtcDateTime, workspace_column


class ConsoleSession(Base):
    __tablename__ = "console_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # SHA-256 of the cookie
    workspace: Mapped[str] = workspace_column()
    agent: Mapped[str] = mapped_column(String(128))
    token_digest: Mapped[str] = mapped_column(String(64))  # SHA-256 of the token, hex
    csrf: Mapped[str] = mapped_column(String(64))  # every form of the session carries it
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    ended_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
