"""cstp.announceIntent: similar past decisions + guardrail verdict + suggestions, and an audit
row for every announcement, however it ended.

The similar-decision search and the guardrail evaluation are the services of queryDecisions
and checkGuardrails; nothing is computed twice here.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import TYPE_CHECKING, cast

import msgspec

from app.approvals import service as approvals
from app.audit.canonical import covered
from app.errors import CONFLICT, CstpError, storage_error
from app.guardrails.service import Request, evaluate_request
from app.operations.context import CallContext
from app.operations.params import known_category
from app.records.filters import SearchFilters
from app.runtime import iso
from app.search.service import Found, similar
from app.wire import Outcome, Status

from . import repository, suggestions
from .schemas import AnnounceIntentParams, AnnounceIntentResult, SimilarDecision
from .writer import Announcement

if TYPE_CHECKING:
    from .repository import StoredIntent

log = logging.getLogger("cstp.intents")

SIMILAR_LIMIT = 5
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(AnnounceIntentResult)


def request_hash(p: AnnounceIntentParams) -> str:
    """What makes two announcements "the same intent" for safe retries."""
    material = {
        "intent": p.intent,
        "context": p.context,
        "category": p.category,
        "stakes": p.stakes,
        "confidence": p.confidence,
        "metadata": p.metadata,
        "project": p.project,
    }
    blob = json.dumps(material, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def notes_of(found: Found) -> str | None:
    d = found.decision
    return d.lessons or d.review_notes or d.actual_result


def similar_item(found: Found) -> SimilarDecision:
    """A similar decision as the answer shows it; ``distance`` is None only in a degraded
    search. The row's enumerations hold only the values its params allowed (cast)."""
    d = found.decision
    return SimilarDecision(
        id=d.id,
        title=d.summary,
        category=d.category,
        confidence=d.confidence,
        status=cast(Status, d.status),
        date=iso(d.created_at),
        distance=None if found.distance is None else round(found.distance, 6),
        outcome=cast(Outcome | None, d.outcome),
        notes=notes_of(found) or None,  # an empty text is no note
    )


def _same_intent(stored: StoredIntent, fingerprint: str) -> None:
    """-32008 unless ``stored`` announced the same intent."""
    if stored.request_hash != fingerprint or stored.response is None:
        raise CstpError(
            CONFLICT,
            "Conflict: this correlationId was already used for a different intent "
            "(its intent, context, category, stakes, confidence, project or metadata differ)",
            {"correlationId": stored.correlation_id},
        )


def _replay(stored: StoredIntent, fingerprint: str) -> AnnounceIntentResult:
    _same_intent(stored, fingerprint)
    assert stored.response is not None
    # The stored answer is this struct's own encoding: decoded and encoded again it is the
    # same JSON (omit_defaults leaves out what it left out).
    return _decoder.decode(stored.response)


async def announce(
    ctx: CallContext, p: AnnounceIntentParams, *, again: bool = False
) -> AnnounceIntentResult:
    """Answer an announcement and record it (see the module docstring). An escalated one is
    never replayed from its stored answer: each re-announcement of its correlationId is
    evaluated again, recorded as an intent row of its own (outcome ``escalated`` while its
    approval is not approved) and answered with where its approval stands; once approved,
    the answer is allowed and stored as any other (outcome ``ok``), so a retry replays it."""
    runtime = ctx.services.runtime
    correlation_id = p.correlation_id or runtime.uuid()
    fingerprint = request_hash(p)
    if p.correlation_id is not None:
        stored = await repository.stored(ctx, correlation_id)
        if stored is not None and stored.outcome == "ok":
            return _replay(stored, fingerprint)
        if stored is not None:  # escalated: announced again, the same intent only
            _same_intent(stored, fingerprint)
    received_at = runtime.now()
    query = f"{p.intent} {p.context or ''}".strip()
    ctx.trace_text("gen_ai.memory.query.text", query)
    searched = await similar(
        ctx, query, SearchFilters(category=p.category, workspace=ctx.workspace), SIMILAR_LIMIT
    )
    found = searched.found
    ctx.trace("gen_ai.memory.record.count", len(found))
    if p.category is not None:
        known_category(p.category, ctx.services.settings.categories, "category")
    staged = evaluate_request(
        ctx,
        Request(p.intent, p.category, p.stakes, p.confidence, p.project, p.metadata),
        source="announceIntent",
    )
    requested = None
    if staged.checked.evaluation.escalated:
        existing = (
            None
            if p.correlation_id is None
            else await approvals.by_correlation(ctx, p.correlation_id)
        )
        staged, requested = staged.escalate(ctx, existing, correlation_id, stated=p.context)
    checked = staged.checked
    shown = [similar_item(f) for f in found]
    ev = checked.evaluation
    advice = [w.suggestion for w in ev.warnings]
    response = AnnounceIntentResult(
        received=True,
        correlation_id=correlation_id,
        received_at=iso(received_at),
        similar_decisions=shown,
        guardrail_status=checked.status(),
        suggestions=suggestions.generate(shown, advice),
        responding_agent=ctx.services.settings.agent_name,
        retrieval_mode="keyword" if searched.degraded else None,
        degraded=searched.degraded,
    )
    encoded = _encoder.encode(response)
    intent_id = runtime.uuid()
    row = {
        "id": intent_id,
        "correlation_id": correlation_id,
        "agent": ctx.agent,
        "workspace": ctx.workspace,
        "received_at": received_at,
        # not approved (yet): a re-announcement is evaluated again, never replayed
        "outcome": "ok" if checked.allowed or checked.escalation is None else "escalated",
        "intent": p.intent,
        "context": p.context,
        "category": p.category,
        "stakes": p.stakes,
        "confidence": p.confidence,
        "metadata": p.metadata,
        "claimed_agent": msgspec.to_builtins(p.agent) if p.agent else None,
        "request_hash": fingerprint,
        "allowed": checked.allowed,
        "evaluation_id": checked.evaluation_id,
        "similar_found": len(found),
        "search_degraded": True if searched.degraded else None,
        "response": encoded.decode(),
        "error_code": None,
    }
    matches = [
        {
            "intent_id": intent_id,
            "workspace": ctx.workspace,
            "decision_id": f.decision.id,
            "rank": rank,
            "distance": f.distance,
            "outcome": f.decision.outcome,
        }
        for rank, f in enumerate(found, start=1)
    ]
    # Both audit digests here, one after the other and before the first statement (which
    # takes SQLite's write lock): the second runs while the first has left the canonical
    # form's code and tables in the CPU's caches, and neither runs under the lock.
    staged.entry  # noqa: B018  (computed and kept for store())
    announcement = Announcement(
        staged,
        row,
        matches,
        covered("intents", row, {"intent_matches": matches}),
        callers_correlation=p.correlation_id is not None,
        approval=requested,
    )
    written = await ctx.services.announcer.write(announcement)
    if written:
        ctx.trace("cstp.intent.id", intent_id)
        ctx.trace("cstp.correlation_id", correlation_id)
        ctx.trace_row("intents", intent_id)
    if not written and requested is not None and not again:
        # A concurrent announcement of this correlationId asked for its approval first:
        # answer as a re-announcement of it does.
        return await announce(ctx, p, again=True)
    if not written:
        # A concurrent retry with the same correlationId committed first: answer as it did.
        stored = await repository.stored(ctx, correlation_id)
        if stored is None or stored.outcome != "ok":  # a bug or a damaged database
            log.error("an announcement's intent row was refused, and not for its correlationId")
            raise storage_error()
        return _replay(stored, fingerprint)
    return response
