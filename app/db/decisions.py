"""Decision tables: one row per decision, its reasons, its tags and its review history."""

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
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from .base import Base, UtcDateTime, workspace_column


class Decision(Base):
    __tablename__ = "decisions"
    __table_args__ = (
        Index("ix_decisions_workspace_created_at", "workspace", "created_at"),
        # A CI report's decisions: those of its workspace with its pull request (revision 0020).
        Index("ix_decisions_workspace_pr", "workspace", "pr"),
    )

    id: Mapped[str] = mapped_column(String(8), primary_key=True)
    workspace: Mapped[str] = workspace_column()
    summary: Mapped[str] = mapped_column(Text)
    decision: Mapped[str] = mapped_column(Text)
    category: Mapped[str] = mapped_column(String(64), index=True)
    confidence: Mapped[float] = mapped_column(Float)
    stakes: Mapped[str] = mapped_column(String(16), index=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    recorded_by: Mapped[str] = mapped_column(String(128), index=True)
    context: Mapped[str | None] = mapped_column(Text)
    mental_state: Mapped[str | None] = mapped_column(String(16))
    review_in: Mapped[str | None] = mapped_column(String(16))
    review_by: Mapped[datetime | None] = mapped_column(UtcDateTime)
    kpi_indicators: Mapped[list[str] | None] = mapped_column(JSON)
    pre_query_run: Mapped[bool | None] = mapped_column(Boolean)
    pre_similar_found: Mapped[int | None] = mapped_column(Integer)
    pre_guardrails_checked: Mapped[bool | None] = mapped_column(Boolean)
    pre_guardrails_passed: Mapped[bool | None] = mapped_column(Boolean)
    project: Mapped[str | None] = mapped_column(String(256), index=True)
    feature: Mapped[str | None] = mapped_column(String(256))
    pr: Mapped[int | None] = mapped_column(Integer)
    file: Mapped[str | None] = mapped_column(Text)
    line: Mapped[int | None] = mapped_column(Integer)
    commit: Mapped[str | None] = mapped_column(String(64))
    # Latest review, copied from decision_reviews so reads need no join.
    outcome: Mapped[str | None] = mapped_column(String(16), index=True)
    reviewed_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    reviewed_by: Mapped[str | None] = mapped_column(String(128))
    actual_result: Mapped[str | None] = mapped_column(Text)
    lessons: Mapped[str | None] = mapped_column(Text)
    review_notes: Mapped[str | None] = mapped_column(Text)
    affected_kpis: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    review_source: Mapped[str | None] = mapped_column(String(8))  # revision 0018
    # What the recording-time check found (revision 0018): ``["not_a_decision"]`` for a
    # status update; NULL when nothing was flagged (and before 0018).
    quality_flags: Mapped[list[str] | None] = mapped_column(JSON)
    # The announced intent this decision followed (recordDecision's correlationId), and the
    # guardrail evaluation made of the decision itself when it was recorded.
    intent_id: Mapped[str | None] = mapped_column(ForeignKey("intents.id"), index=True)
    # That intent's correlationId, the id the client chose (kept here so that clients and
    # auditors find it on the decision; an imported decision may carry one without an intent).
    correlation_id: Mapped[str | None] = mapped_column(String(128), index=True)
    guardrail_evaluation_id: Mapped[str | None] = mapped_column(
        ForeignKey("guardrail_evaluations.id")
    )
    # The decision that superseded this one (revision 0019), the newest when several did:
    # copied from the latest ``decision_supersedes`` row naming it, so reads need no join, and
    # set when that row is written, like the review columns (``cstp audit verify`` holds it
    # to the chained links). NULL while nothing supersedes it.
    superseded_by: Mapped[str | None] = mapped_column(String(8))

    reasons: Mapped[list[DecisionReason]] = relationship(
        order_by="DecisionReason.position", lazy="raise", cascade="all, delete-orphan"
    )
    tags: Mapped[list[DecisionTag]] = relationship(
        order_by="DecisionTag.position", lazy="raise", cascade="all, delete-orphan"
    )
    # The decisions this one supersedes (recordDecision's ``supersedes``), in the given order.
    supersedes: Mapped[list[DecisionSupersede]] = relationship(
        order_by="DecisionSupersede.position",
        foreign_keys="DecisionSupersede.decision_id",
        lazy="raise",
        cascade="all, delete-orphan",
    )

    @property
    def tag_names(self) -> list[str]:
        return [t.tag for t in self.tags]


class DecisionReason(Base):
    __tablename__ = "decision_reasons"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    decision_id: Mapped[str] = mapped_column(
        ForeignKey("decisions.id", ondelete="CASCADE"), index=True
    )
    workspace: Mapped[str] = workspace_column()
    position: Mapped[int] = mapped_column(Integer)
    type: Mapped[str] = mapped_column(String(16))
    text: Mapped[str] = mapped_column(Text)
    strength: Mapped[float] = mapped_column(Float)


class DecisionTag(Base):
    __tablename__ = "decision_tags"
    __table_args__ = (Index("ix_decision_tags_tag", "tag"),)

    decision_id: Mapped[str] = mapped_column(
        ForeignKey("decisions.id", ondelete="CASCADE"), primary_key=True
    )
    tag: Mapped[str] = mapped_column(String(128), primary_key=True)
    workspace: Mapped[str] = workspace_column()
    position: Mapped[int] = mapped_column(Integer)


class DecisionSupersede(Base):
    """A supersede link (revision 0019): the decision ``decision_id`` supersedes the earlier
    decision ``superseded_id`` of the same workspace. A child row of the superseding decision,
    covered by its chain entry; append-only. Its id follows the order the links were made in
    (each is made under the superseded decision's row lock), so the latest link naming a
    decision is the one with the greatest id: the one ``decisions.superseded_by`` copies."""

    __tablename__ = "decision_supersedes"
    __table_args__ = (UniqueConstraint("decision_id", "superseded_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    decision_id: Mapped[str] = mapped_column(ForeignKey("decisions.id"))
    superseded_id: Mapped[str] = mapped_column(ForeignKey("decisions.id"), index=True)
    workspace: Mapped[str] = workspace_column()
    position: Mapped[int] = mapped_column(Integer)


class DecisionReview(Base):
    """One review of a decision; every review is kept (insert-only), the decision shows the
    latest in its own outcome columns."""

    __tablename__ = "decision_reviews"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    decision_id: Mapped[str] = mapped_column(ForeignKey("decisions.id"), index=True)
    outcome: Mapped[str] = mapped_column(String(16))
    workspace: Mapped[str] = workspace_column()
    actual_result: Mapped[str | None] = mapped_column(Text)
    lessons: Mapped[str | None] = mapped_column(Text)
    notes: Mapped[str | None] = mapped_column(Text)
    affected_kpis: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    reviewed_by: Mapped[str] = mapped_column(String(128), index=True)
    reviewed_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    # Where the outcome comes from (revision 0018): ``agent`` (reviewDecision: the agent's
    # claim), ``human`` (a person, in the console) or ``ci`` (observed by CI).
    source: Mapped[str] = mapped_column(String(8), default="agent", server_default="agent")


class WorkspaceDecisions(Base):
    """How many decisions a workspace holds, counted by a trigger on ``decisions`` (revision
    0015): what the keyword side's word weights are computed against."""

    __tablename__ = "workspace_decisions"

    workspace: Mapped[str] = mapped_column(String(63), primary_key=True)
    decisions: Mapped[int] = mapped_column(Integer)
