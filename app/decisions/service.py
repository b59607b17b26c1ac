"""Record, get and list decisions.

Services never commit: the rpc layer owns the transaction. The one exception is
recordDecision, whose rows the group writer (app.decisions.writer) commits together with
those of concurrent calls."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from sqlalchemy import Select, case, func, or_, select
from sqlalchemy.orm import selectinload

from app.db.decisions import Decision, DecisionReason, DecisionTag
from app.errors import GUARDRAIL_EVAL_FAILED, CstpError, invalid_params
from app.guardrails.service import Request, Staged, evaluate_request
from app.intents.service import intent_for_decision
from app.operations.context import CallContext
from app.operations.params import parse_timestamp
from app.runtime import iso

from . import document
from .reviews import review_history
from .schemas import (
    GetDecisionParams,
    ListDecisionsParams,
    RecordDecisionParams,
    RecordDecisionResult,
)

REVIEW_UNITS = {"d": 1, "w": 7, "m": 30}


def review_delta(review_in: str) -> timedelta:
    return timedelta(days=int(review_in[:-1]) * REVIEW_UNITS[review_in[-1]])


def _unique(values: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for value in values:
        seen.setdefault(value.strip(), None)
    return list(seen)


async def _link_intent(ctx: CallContext, p: RecordDecisionParams) -> dict[str, Any]:
    """The announced intent's link and pre-decision facts, as taken from what was recorded."""
    if p.correlation_id is None:
        return {}
    intent = await intent_for_decision(ctx, p.correlation_id)
    if intent is None:
        raise invalid_params(
            "correlationId", "no intent with this correlationId was announced by this agent"
        )
    return {
        "intent_id": intent.id,
        "correlation_id": p.correlation_id,
        "pre_query_run": True,
        "pre_similar_found": intent.similar_found,
        "pre_guardrails_checked": True,
        "pre_guardrails_passed": intent.allowed,
    }


def _evaluate_guardrails(ctx: CallContext, p: RecordDecisionParams) -> Staged | None:
    """A guardrail evaluation of the decision as recorded (never blocks recording)."""
    request = Request(p.decision, p.category, p.stakes, p.confidence, p.project, {})
    try:
        return evaluate_request(ctx, request, source="recordDecision")
    except CstpError as exc:
        if exc.code != GUARDRAIL_EVAL_FAILED:
            raise
        return None


async def record(ctx: CallContext, p: RecordDecisionParams) -> RecordDecisionResult:
    """Validate, evaluate and hand the rows to the group writer (app.decisions.writer), which
    commits them with concurrent calls' rows and returns once the outbox pass is done."""
    settings = ctx.services.settings
    if p.category not in settings.categories:
        raise invalid_params("category", "must be one of: " + ", ".join(settings.categories))
    now = ctx.services.runtime.now()
    pre = p.pre_decision
    fields: dict[str, Any] = {
        "summary": document.summarize(p.decision),
        "decision": p.decision.strip(),
        "category": p.category,
        "confidence": float(p.confidence),
        "stakes": p.stakes,
        "status": "pending",
        "created_at": now,
        "recorded_by": ctx.agent,
        "context": p.context,
        "mental_state": p.mental_state,
        "review_in": p.review_in,
        "review_by": now + review_delta(p.review_in) if p.review_in else None,
        "kpi_indicators": _unique(p.kpi_indicators) or None,
        "pre_query_run": pre.query_run if pre else None,
        "pre_similar_found": pre.similar_found if pre else None,
        "pre_guardrails_checked": pre.guardrails_checked if pre else None,
        "pre_guardrails_passed": pre.guardrails_passed if pre else None,
        "project": p.project,
        "feature": p.feature,
        "pr": p.pr,
        "file": p.file,
        "line": p.line,
        "commit": p.commit,
    }
    tags = _unique(p.tags)

    def build() -> Decision:
        decision = Decision(**fields)
        decision.reasons = [
            DecisionReason(position=i, type=r.type, text=r.text, strength=float(r.strength))
            for i, r in enumerate(p.reasons)
        ]
        decision.tags = [DecisionTag(tag=t, position=i) for i, t in enumerate(tags)]
        return decision

    # Embed while the rows are written and committed: the outbox pass finds the vector ready.
    prepared = asyncio.ensure_future(ctx.services.index.prepare([document.index_text(build())]))
    fields.update(await _link_intent(ctx, p))
    staged = _evaluate_guardrails(ctx, p)
    fields["guardrail_evaluation_id"] = staged.checked.evaluation_id if staged else None
    decision, indexed = await ctx.services.recorder.write(build, staged, prepared)
    return RecordDecisionResult(
        success=True,
        id=decision.id,
        path=document.relative_path(decision),
        indexed=indexed,
        timestamp=iso(now),
    )


async def get(ctx: CallContext, p: GetDecisionParams) -> dict[str, Any]:
    decision = await document.load_one(ctx.session, p.id)
    reviews = await review_history(ctx.session, p.id)
    return {"found": True, "decision": document.wire(decision, reviews=reviews)}


STAKES_ORDER = {"low": 0, "medium": 1, "high": 2, "critical": 3}
_SORT = {
    "createdAt": Decision.created_at,
    "confidence": Decision.confidence,
    "category": Decision.category,
    "stakes": case(STAKES_ORDER, value=Decision.stakes, else_=-1),  # by severity
    "status": Decision.status,
}


def _filtered(p: ListDecisionsParams) -> Select[Decision]:
    query = select(Decision)
    for column, value in (
        (Decision.category, p.category),
        (Decision.stakes, p.stakes),
        (Decision.status, p.status),
        (Decision.recorded_by, p.agent),
        (Decision.correlation_id, p.correlation_id),
    ):
        if value is not None:
            query = query.where(column == value)
    for tag in _unique(p.tags):
        query = query.where(
            select(DecisionTag.decision_id)
            .where(DecisionTag.decision_id == Decision.id, DecisionTag.tag == tag)
            .exists()
        )
    if p.date_from:
        query = query.where(Decision.created_at >= parse_timestamp("dateFrom", p.date_from))
    if p.date_to:
        # A timestamp is an exclusive end; a bare date means "through that day".
        end = parse_timestamp("dateTo", p.date_to)
        if len(p.date_to.strip()) == 10 and end.year < 9999:
            end += timedelta(days=1)
        query = query.where(Decision.created_at < end)
    if p.search and p.search.strip():
        needle = "%" + _escape_like(p.search.strip().lower()) + "%"
        query = query.where(
            or_(
                func.lower(Decision.decision).like(needle, escape="\\"),
                func.lower(func.coalesce(Decision.context, "")).like(needle, escape="\\"),
            )
        )
    return query


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


async def list_decisions(ctx: CallContext, p: ListDecisionsParams) -> dict[str, Any]:
    query = _filtered(p)
    total = await ctx.session.scalar(select(func.count()).select_from(query.subquery()))
    column = _SORT[p.sort]
    ordering = column.asc() if p.order == "asc" else column.desc()
    tiebreak = Decision.id.asc() if p.order == "asc" else Decision.id.desc()
    rows = await ctx.session.scalars(
        query.options(selectinload(Decision.tags))
        .order_by(ordering, tiebreak)
        .offset(p.offset)
        .limit(p.limit)
    )
    return {
        "decisions": [document.listed(d) for d in rows],
        "total": int(total or 0),
        "limit": p.limit,
        "offset": p.offset,
    }
