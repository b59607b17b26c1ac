"""What an agent was shown at the start of a session (cstp.getSessionContext, SPEC.md section
9): each brief stored as it was sent, append-only and chained, so an auditor can read exactly
what an agent knew when it acted."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, UtcDateTime, workspace_column


class SessionBrief(Base):
    __tablename__ = "session_briefs"
    __table_args__ = (
        Index("ix_session_briefs_workspace_agent_created_at", "workspace", "agent", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    workspace: Mapped[str] = workspace_column()
    agent: Mapped[str] = mapped_column(String(128))
    task: Mapped[str | None] = mapped_column(Text)
    format: Mapped[str] = mapped_column(String(8))  # markdown | json
    max_tokens: Mapped[int] = mapped_column(Integer)
    tokens: Mapped[int] = mapped_column(Integer)  # counted with the embedder's tokenizer
    content: Mapped[str] = mapped_column(Text)  # exactly what was sent (JSON text for json)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
