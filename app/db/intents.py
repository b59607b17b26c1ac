"""The audit trail of announced intents and what each was shown (append-only)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, UtcDateTime, workspace_column


class Intent(Base):
    __tablename__ = "intents"
    __table_args__ = (
        # One successful announcement per (workspace, agent, correlation id): the safe-retry key.
        Index(
            "uq_intents_workspace_agent_correlation_ok",
            "workspace",
            "agent",
            "correlation_id",
            unique=True,
            sqlite_where=text("outcome = 'ok'"),
            postgresql_where=text("outcome = 'ok'"),
        ),
        Index("ix_intents_workspace_received_at", "workspace", "received_at"),
        # The escalated announcements of a correlation id (revision 0016); partial, so that
        # the other rows cost it nothing.
        Index(
            "ix_intents_workspace_agent_correlation_escalated",
            "workspace",
            "agent",
            "correlation_id",
            sqlite_where=text("outcome = 'escalated'"),
            postgresql_where=text("outcome = 'escalated'"),
        ),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    workspace: Mapped[str] = workspace_column()
    correlation_id: Mapped[str] = mapped_column(String(128))
    agent: Mapped[str] = mapped_column(String(128), index=True)
    received_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    outcome: Mapped[str] = mapped_column(String(16), index=True)  # ok | rate_limited | failed
    error_code: Mapped[int | None] = mapped_column(Integer)
    intent: Mapped[str | None] = mapped_column(Text)
    context: Mapped[str | None] = mapped_column(Text)
    category: Mapped[str | None] = mapped_column(String(64))
    stakes: Mapped[str | None] = mapped_column(String(16))
    confidence: Mapped[float | None] = mapped_column(Float)
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON)
    claimed_agent: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    request_hash: Mapped[str | None] = mapped_column(String(64))
    allowed: Mapped[bool | None] = mapped_column(Boolean)
    evaluation_id: Mapped[str | None] = mapped_column(
        ForeignKey("guardrail_evaluations.id"), index=True
    )
    similar_found: Mapped[int | None] = mapped_column(Integer)
    response: Mapped[str | None] = mapped_column(Text)
    # True when the similar decisions came from keyword search alone, the vector index being
    # unusable; NULL on failed calls and on rows stored before revision 0011.
    search_degraded: Mapped[bool | None] = mapped_column(Boolean)


class IntentMatch(Base):
    __tablename__ = "intent_matches"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    intent_id: Mapped[str] = mapped_column(ForeignKey("intents.id"), index=True)
    workspace: Mapped[str] = workspace_column()
    decision_id: Mapped[str] = mapped_column(ForeignKey("decisions.id"), index=True)
    rank: Mapped[int] = mapped_column(Integer)
    distance: Mapped[float | None] = mapped_column(Float)  # NULL: shown by a degraded search
    outcome: Mapped[str | None] = mapped_column(String(16))
