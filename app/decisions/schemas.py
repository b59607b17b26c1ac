"""Wire structs of the decision methods: strict at the edge, camelCase on the wire. The types
several contexts share are in app.wire."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from app.wire import (
    CorrelationId,
    Count,
    DecisionId,
    DecisionItem,
    FreeForm,
    LongText,
    Moment,
    NonBlank,
    Outcome,
    ReasonOut,
    ReviewSource,
    ShortText,
    Stakes,
    Status,
    Struct,
    Tag,
    Unit,
)

ReasonType = Literal[
    "authority",
    "analogy",
    "analysis",
    "pattern",
    "intuition",
    "empirical",
    "elimination",
    "constraint",
]
MentalState = Literal["deliberate", "reactive", "exploratory", "habitual", "pressured"]
ReviewIn = Annotated[str, Meta(pattern=r"\A[1-9][0-9]{0,3}[dwm]\Z", max_length=5)]
Order = Literal["asc", "desc"]
SortKey = Literal["createdAt", "confidence", "category", "stakes", "status"]


class ReasonIn(Struct):
    type: ReasonType
    text: NonBlank
    strength: Unit = 0.8


class PreDecisionIn(Struct):
    query_run: bool | None = None
    similar_found: Count | None = None
    guardrails_checked: bool | None = None
    guardrails_passed: bool | None = None


class RecordDecisionParams(Struct):
    decision: NonBlank
    confidence: Unit
    category: ShortText
    stakes: Stakes = "medium"
    context: LongText | None = None
    reasons: Annotated[list[ReasonIn], Meta(max_length=100)] = []  # noqa: RUF012 - a msgspec field
    kpi_indicators: Annotated[list[ShortText], Meta(max_length=100)] = []  # noqa: RUF012 - a msgspec field
    mental_state: MentalState | None = None
    review_in: ReviewIn | None = None
    tags: Annotated[list[Tag], Meta(max_length=100)] = []  # noqa: RUF012 - a msgspec field
    pre_decision: PreDecisionIn | None = None
    project: ShortText | None = None
    feature: ShortText | None = None
    pr: Count | None = None
    file: Annotated[str, Meta(max_length=4096)] | None = None
    line: Count | None = None
    commit: Annotated[str, Meta(max_length=64)] | None = None
    correlation_id: CorrelationId | None = None
    # The earlier decisions of the caller's workspace this one replaces (SPEC.md, section 9).
    supersedes: Annotated[list[DecisionId], Meta(max_length=20)] = []  # noqa: RUF012 - a msgspec field


class GetDecisionParams(Struct):
    id: DecisionId


class ListDecisionsParams(Struct):
    limit: Annotated[int, Meta(ge=1, le=500)] = 20
    offset: Count = 0
    category: ShortText | None = None
    stakes: Stakes | None = None
    status: Status | None = None
    agent: ShortText | None = None
    correlation_id: CorrelationId | None = None
    tags: Annotated[list[Tag], Meta(max_length=50)] = []  # noqa: RUF012 - a msgspec field
    date_from: Moment | None = None
    date_to: Moment | None = None
    search: Annotated[str, Meta(max_length=1000)] | None = None
    sort: SortKey = "createdAt"
    order: Order = "desc"
    include_superseded: bool = False  # superseded decisions are left out unless asked for


class QualityOut(msgspec.Struct):
    """What the check at recording time found: ``not_a_decision`` for a status update (no
    choice among alternatives), which calibration leaves out unless it is reviewed."""

    flags: list[str]


class RecordDecisionResult(msgspec.Struct, rename="camel"):
    success: bool
    id: str
    path: str
    indexed: bool
    timestamp: str
    quality: QualityOut


def drop_none(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None}


class ReviewDecisionParams(Struct):
    id: DecisionId
    outcome: Outcome
    actual_result: LongText | None = None
    lessons: LongText | None = None
    notes: LongText | None = None
    affected_kpis: FreeForm | None = None


# --- results: what the methods answer (documented by rpc.discover; tests hold the answers to
# these schemas) ---------------------------------------------------------------------------


class PreDecisionOut(Struct):
    query_run: bool | None
    similar_found: int | None
    guardrails_checked: bool | None
    guardrails_passed: bool | None


class ReviewOut(Struct):
    outcome: Outcome
    actual_result: str | None
    lessons: str | None
    notes: str | None
    affected_kpis: dict[str, Any] | None
    reviewed_by: str
    reviewed_at: str
    source: ReviewSource


class DecisionOut(Struct):
    """Every stored field of a decision (getDecision)."""

    id: str
    title: str
    summary: str
    decision: str
    category: str
    confidence: float
    stakes: Stakes
    status: Status
    date: str
    created_at: str
    context: str | None
    reasons: list[ReasonOut]
    kpi_indicators: list[str]
    mental_state: MentalState | None
    review_in: str | None
    review_by: str | None
    tags: list[str]
    pre_decision: PreDecisionOut
    recorded_by: str
    project: str | None
    feature: str | None
    pr: int | None
    file: str | None
    line: int | None
    commit: str | None
    outcome: Outcome | None
    reviewed_at: str | None
    reviewed_by: str | None
    actual_result: str | None
    lessons: str | None
    review_notes: str | None
    affected_kpis: dict[str, Any] | None
    intent_id: str | None
    correlation_id: str | None
    guardrail_evaluation_id: str | None
    path: str
    reviews: list[ReviewOut] = []  # noqa: RUF012 - a msgspec field
    # The decision that superseded this one (the newest, when several did), and the decisions
    # this one supersedes, in the order it named them.
    superseded_by: str | None = None
    supersedes: list[str] = []  # noqa: RUF012 - a msgspec field


class GetDecisionResult(Struct):
    found: bool
    decision: DecisionOut


class ListedDecision(DecisionItem):
    correlation_id: str | None = None


class ListDecisionsResult(Struct):
    decisions: list[ListedDecision]
    total: int
    limit: int
    offset: int


class ReviewDecisionResult(Struct):
    success: bool
    id: str
    path: str
    status: Literal["reviewed"]
    reviewed_at: str
    reindexed: bool
