"""Stored guardrail evaluations: every check, its input, verdict and each applicable rule."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, UtcDateTime


class GuardrailEvaluation(Base):
    __tablename__ = "guardrail_evaluations"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
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


class GuardrailRuleResult(Base):
    __tablename__ = "guardrail_rule_results"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    evaluation_id: Mapped[str] = mapped_column(ForeignKey("guardrail_evaluations.id"), index=True)
    guardrail_id: Mapped[str] = mapped_column(String(128), index=True)
    severity: Mapped[str] = mapped_column(String(8))
    fired: Mapped[bool] = mapped_column(Boolean)
    message: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
