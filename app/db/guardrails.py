"""Stored guardrail evaluations: every check, its input, verdict and each applicable rule."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    false,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, UtcDateTime, workspace_column


class GuardrailEvaluation(Base):
    __tablename__ = "guardrail_evaluations"
    __table_args__ = (
        Index("ix_guardrail_evaluations_workspace_evaluated_at", "workspace", "evaluated_at"),
        # Partial (revision 0016): the evaluations of no approval cost it nothing.
        Index(
            "ix_guardrail_evaluations_approval_id",
            "approval_id",
            sqlite_where=text("approval_id IS NOT NULL"),
            postgresql_where=text("approval_id IS NOT NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    workspace: Mapped[str] = workspace_column()
    agent: Mapped[str] = mapped_column(String(128), index=True)
    source: Mapped[str] = mapped_column(String(32))  # checkGuardrails | announceIntent | ...
    evaluated_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    description: Mapped[str] = mapped_column(Text)
    category: Mapped[str | None] = mapped_column(String(64))
    stakes: Mapped[str | None] = mapped_column(String(16))
    confidence: Mapped[float | None] = mapped_column(Float)
    project: Mapped[str | None] = mapped_column(String(256))
    facts: Mapped[dict[str, Any]] = mapped_column(JSON)
    allowed: Mapped[bool] = mapped_column(Boolean)
    evaluated: Mapped[int] = mapped_column(Integer)
    violations: Mapped[int] = mapped_column(Integer)
    warnings: Mapped[int] = mapped_column(Integer)
    rule_set_version: Mapped[str] = mapped_column(String(64))
    # The exact rule set used: SHA-256 of its canonical content, a guardrail_rule_sets row
    # (NULL for evaluations stored before rule sets were kept). No foreign key: SQLite would
    # rebuild this append-only table to add one.
    rule_set_hash: Mapped[str | None] = mapped_column(String(64), index=True)
    # How many enforced escalate rules fired or failed (revision 0016; NULL before it). They
    # asked for a person's approval when no block rule fired (``approvals``).
    escalations: Mapped[int | None] = mapped_column(Integer)
    # The approval an escalated evaluation asked for, or answered with (revision 0016): once
    # it is approved, ``allowed`` (the verdict answered) is true. No foreign key: SQLite
    # would rebuild this append-only table to add one.
    approval_id: Mapped[str | None] = mapped_column(String(36))


class GuardrailRuleResult(Base):
    __tablename__ = "guardrail_rule_results"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    evaluation_id: Mapped[str] = mapped_column(ForeignKey("guardrail_evaluations.id"), index=True)
    workspace: Mapped[str] = workspace_column()
    guardrail_id: Mapped[str] = mapped_column(String(128), index=True)
    severity: Mapped[str] = mapped_column(String(8))
    fired: Mapped[bool] = mapped_column(Boolean)
    message: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    # "enforce", or "shadow": evaluated and stored, never part of the verdict. A shadow rule
    # never has ``fired`` set; what it would have done is in would_block / would_warn.
    mode: Mapped[str] = mapped_column(String(8), default="enforce", server_default="enforce")
    would_block: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    would_warn: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # An escalate rule's only (revision 0016): a shadow one's "would have asked for approval";
    # NULL for the other actions and before 0016.
    would_escalate: Mapped[bool | None] = mapped_column(Boolean)


class GuardrailRuleSet(Base):
    """Every rule set an evaluation used, stored once, with its full content (the canonical
    JSON whose SHA-256 is ``hash``), so a verdict can be replayed with the rules of its day."""

    __tablename__ = "guardrail_rule_sets"

    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[str] = mapped_column(String(64))  # the ruleSetVersion clients were shown
    rules: Mapped[int] = mapped_column(Integer)  # how many rules it holds
    content: Mapped[str] = mapped_column(Text)
