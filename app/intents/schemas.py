"""Wire structs of cstp.announceIntent (seed F004)."""

from __future__ import annotations

from typing import Literal

from app.guardrails.schemas import GuardrailStatus
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


# omit_defaults: ``distance``, ``outcome`` and ``notes`` are absent when there is none.
class SimilarDecision(Struct, omit_defaults=True):
    """A similar past decision; ``distance`` (cosine, 0 = same meaning) is absent only when the
    search was degraded."""

    id: str
    title: str
    category: str
    confidence: float
    status: Status
    date: str
    distance: float | None = None
    outcome: Outcome | None = None
    notes: str | None = None


# omit_defaults: ``retrievalMode`` and ``degraded`` are absent unless the search was degraded.
class AnnounceIntentResult(Struct, omit_defaults=True):
    """``degraded`` (true) and ``retrievalMode`` ("keyword") are there only when the vector
    index could not be used: the similar decisions are then the keyword search's, without
    distances; the guardrails' verdict is complete."""

    received: bool
    correlation_id: str
    received_at: str
    similar_decisions: list[SimilarDecision]
    guardrail_status: GuardrailStatus
    suggestions: list[str]
    responding_agent: str
    retrieval_mode: Literal["keyword"] | None = None
    degraded: bool = False
