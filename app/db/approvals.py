"""Approvals (SPEC.md, section 8): a person's answer to an escalated guardrail evaluation.

- ``approvals``: one row per request, written in the transaction of the evaluation that
  escalated: who asked, for which action (as evaluated), under which correlationId, which
  escalate rules fired, when it was asked and until when it waits.
- ``approval_decisions``: at most one row per approval (its primary key is the approval's
  id, so the database itself lets an approval be decided once): ``approved`` or ``denied``
  by a person, with their agent, time and reason, or ``expired``, written once the deadline
  has passed.

Both are append-only audit rows, covered by the hash chain. An approval's status is derived,
never stored: its decision's verdict, else ``expired`` once ``expires_at`` has passed (whether
or not the expiry row is written yet), else ``pending``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, CheckConstraint, ForeignKey, Index, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, UtcDateTime, workspace_column

APPROVED = "approved"
DENIED = "denied"
EXPIRED = "expired"
PENDING = "pending"
VERDICTS = (APPROVED, DENIED, EXPIRED)


class Approval(Base):
    __tablename__ = "approvals"
    __table_args__ = (
        # One approval per (workspace, agent, correlation id): a re-announcement finds it.
        Index(
            "uq_approvals_workspace_requested_by_correlation",
            "workspace",
            "requested_by",
            "correlation_id",
            unique=True,
            sqlite_where=text("correlation_id IS NOT NULL"),
            postgresql_where=text("correlation_id IS NOT NULL"),
        ),
        Index("ix_approvals_workspace_created_at", "workspace", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    workspace: Mapped[str] = workspace_column()
    evaluation_id: Mapped[str] = mapped_column(ForeignKey("guardrail_evaluations.id"), index=True)
    source: Mapped[str] = mapped_column(String(32))  # announceIntent | checkGuardrails
    requested_by: Mapped[str] = mapped_column(String(128))
    correlation_id: Mapped[str | None] = mapped_column(String(128))
    # The action as it was evaluated: description, category, stakes, confidence, project,
    # context; and the SHA-256 of its canonical JSON, which a later call must match.
    action: Mapped[dict[str, Any]] = mapped_column(JSON)
    action_sha256: Mapped[str] = mapped_column(String(64))
    rules: Mapped[list[str]] = mapped_column(JSON)  # the escalate rules that fired, in order
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)  # expiry's pass


class ApprovalDecision(Base):
    __tablename__ = "approval_decisions"
    __table_args__ = (
        CheckConstraint("verdict IN ('approved', 'denied', 'expired')", name="verdict"),
    )

    approval_id: Mapped[str] = mapped_column(ForeignKey("approvals.id"), primary_key=True)
    workspace: Mapped[str] = workspace_column()
    verdict: Mapped[str] = mapped_column(String(8))
    decided_by: Mapped[str | None] = mapped_column(String(128))  # NULL for an expiry
    decided_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    reason: Mapped[str | None] = mapped_column(Text)
