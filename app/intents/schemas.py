"""Wire structs of cstp.announceIntent (seed F004)."""

from __future__ import annotations

from app.guardrails.schemas import GuardrailHit
from app.wire import (
    AgentIn,
    CorrelationId,
    FreeForm,
    LongText,
    NonBlank,
    Outcome,
    ShortText,
    Stakes,
    Status,
    Struct,
    Unit,
)


class AnnounceIntentParams(Struct):
    intent: NonBlank
    context: LongText | None = None
    category: ShortText | None = None
    stakes: Stakes = "medium"
    confidence: Unit | None = None
    agent: AgentIn | None = None
    correlation_id: CorrelationId | None = None
    metadata: FreeForm = {}  # noqa: RUF012 - a msgspec field: each instance gets a copy
    project: ShortText | None = None


class SimilarDecision(Struct):
    id: str
    title: str
    category: str
    confidence: float
    status: Status
    date: str
    distance: float
    outcome: Outcome | None = None
    notes: str | None = None


class GuardrailStatus(Struct):
    allowed: bool
    violations: list[GuardrailHit]
    warnings: list[GuardrailHit]
    evaluated: int
    evaluation_id: str


class AnnounceIntentResult(Struct):
    received: bool
    correlation_id: str
    received_at: str
    similar_decisions: list[SimilarDecision]
    guardrail_status: GuardrailStatus
    suggestions: list[str]
    responding_agent: str
