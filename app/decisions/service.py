"""Record, get and list decisions.

Services never commit: the rpc layer owns the transaction. The one exception is
recordDecision, whose rows the group writer (app.decisions.writer) commits together with
those of concurrent calls."""

from __future__ import annotations

import asyncio
import functools
from datetime import timedelta
from typing import Any

from app.db.decisions import Decision, DecisionReason, DecisionTag
from app.errors import (
    GUARDRAIL_EVAL_FAILED,
    CstpError,
    decision_not_found,
    forbidden,
    invalid_params,
)
from app.guardrails.service import Request, Staged, evaluate_request
from app.intents.repository import stored as stored_intent
from app.operations.context import CallContext
from app.operations.params import known_category
from app.records.entries import index_text
from app.runtime import iso
from app.scopes import REVIEW_ANY

from . import document, quality, repository
from .schemas import (
    GetDecisionParams,
    GetDecisionResult,
    ListDecisionsParams,
    ListDecisionsResult,
    QualityOut,
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
    intent = await stored_intent(ctx, p.correlation_id)
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


async def _superseded(ctx: CallContext, p: RecordDecisionParams) -> tuple[str, ...]:
    """The decisions ``supersedes`` names, each once and in order, once every one is known
    to be a decision of the caller's workspace: -32007 naming the first that is not (another
    workspace's id reads as unknown, as everywhere), -32602 for one named twice. A decision
    already superseded may be superseded again (its ``supersededBy`` then shows the newest).
    Read as recordDecision reads its intent: a short read of its own, ended before the rows
    go to the batched writer (decisions are never deleted or moved, so the answer holds)."""
    ids = tuple(p.supersedes)
    if not ids:
        return ()
    if len(set(ids)) != len(ids):
        raise invalid_params("supersedes", "names a decision more than once")
    known = await ctx.services.db.read(
        functools.partial(repository.existing, workspace=ctx.workspace, ids=ids),
        session=ctx.open_session,
    )
    for decision_id in ids:
        if decision_id not in known:
            raise decision_not_found(decision_id)
    # Superseding takes a decision out of every search and list: another agent's, as
    # reviewing it, needs review:any.
    if any(known[d] != ctx.agent for d in ids) and not ctx.principal.may(REVIEW_ANY):
        raise forbidden(
            REVIEW_ANY, "superseding a decision another agent recorded needs this scope"
        )
    return ids


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
    known_category(p.category, ctx.services.settings.categories, "category")
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
        "workspace": ctx.workspace,
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
    flagged = quality.flags(p.decision, reasons=len(p.reasons), context=p.context)
    if flagged:  # else left out: SQL NULL (a JSON column would store None as JSON null)
        fields["quality_flags"] = flagged
    tags = _unique(p.tags)
    supersedes = await _superseded(ctx, p)

    def build() -> Decision:
        decision = Decision(**fields)
        decision.reasons = [
            DecisionReason(
                workspace=ctx.workspace,
                position=i,
                type=r.type,
                text=r.text,
                strength=float(r.strength),
            )
            for i, r in enumerate(p.reasons)
        ]
        decision.tags = [
            DecisionTag(workspace=ctx.workspace, tag=t, position=i) for i, t in enumerate(tags)
        ]
        decision.supersedes = repository.supersede_links(ctx.workspace, supersedes)
        return decision

    # Embed while the rows are written and committed: the outbox pass finds the vector ready.
    prepared = asyncio.ensure_future(ctx.services.index.prepare([index_text(build())]))
    fields.update(await _link_intent(ctx, p))
    staged = _evaluate_guardrails(ctx, p)
    fields["guardrail_evaluation_id"] = staged.checked.evaluation_id if staged else None
    ctx.trace_text("cstp.decision.text", p.decision)
    decision, indexed = await ctx.services.recorder.write(build, staged, prepared, supersedes)
    ctx.trace("gen_ai.memory.record.id", decision.id)
    if p.correlation_id is not None:
        ctx.trace("cstp.correlation_id", p.correlation_id)
    ctx.trace_row("decisions", decision.id)
    return RecordDecisionResult(
        success=True,
        id=decision.id,
        path=document.relative_path(decision),
        indexed=indexed,
        timestamp=iso(now),
        quality=QualityOut(flags=flagged),
    )


async def get(ctx: CallContext, p: GetDecisionParams) -> GetDecisionResult:
    decision, reviews = await repository.load_with_reviews(ctx.session, ctx.workspace, p.id)
    return GetDecisionResult(found=True, decision=document.wire(decision, list(reviews)))


async def list_decisions(ctx: CallContext, p: ListDecisionsParams) -> ListDecisionsResult:
    total, rows = await repository.list_page(ctx.session, ctx.workspace, p)
    return ListDecisionsResult(
        decisions=[document.listed(d) for d in rows],
        total=total,
        limit=p.limit,
        offset=p.offset,
    )
