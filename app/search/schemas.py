"""Wire structs of cstp.queryDecisions."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from app.wire import (
    Count,
    DecisionItem,
    Moment,
    ReasonOut,
    ShortText,
    Stakes,
    Status,
    Struct,
    Tag,
    Unit,
)

StakesList = Annotated[list[Stakes], Meta(max_length=4)]
# How queryDecisions searches: by meaning, by words, or both (app.search.service).
RetrievalMode = Literal["semantic", "keyword", "hybrid"]
StatusList = Annotated[list[Status], Meta(max_length=2)]


class QueryFiltersIn(Struct):
    category: ShortText | None = None
    stakes: Stakes | StakesList | None = None
    status: Status | StatusList | None = None
    min_confidence: Unit | None = None
    max_confidence: Unit | None = None
    date_after: Moment | None = None
    date_before: Moment | None = None
    agent: ShortText | None = None
    tags: Annotated[list[Tag], Meta(max_length=50)] | None = None
    project: ShortText | None = None
    feature: ShortText | None = None
    pr: Count | None = None
    has_outcome: bool | None = None


class QueryDecisionsParams(Struct):
    query: Annotated[str, Meta(pattern=r"\S", max_length=4000)]
    limit: Annotated[int, Meta(ge=1, le=50)] = 10
    include_reasons: bool = False
    filters: QueryFiltersIn | None = None
    retrieval_mode: RetrievalMode | None = None
    include_superseded: bool = False  # superseded decisions are left out unless asked for


# ``distance`` is absent where only the keyword side found it, ``reasons`` unless asked for
# (DecisionItem's omit_defaults); the fields in the answer's key order.
class FoundDecision(DecisionItem, kw_only=True):
    distance: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    score: float
    reasons: list[ReasonOut] | None = None


class QueryDecisionsResult(Struct):
    decisions: list[FoundDecision]
    total: int
    query: str
    query_time_ms: float
    agent: str
    retrieval_mode: RetrievalMode
