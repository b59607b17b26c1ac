"""cstp.reviewDecision: every review is kept; the decision row shows the latest.

The refreshed YAML file and index entry go through the outbox, built by the same document
functions as at record time, so no field is dropped and the outcome becomes filterable.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.outbox import EventKind
from app.operations.context import CallContext
from app.runtime import iso

from . import document, repository
from .schemas import ReviewDecisionParams


async def review(ctx: CallContext, p: ReviewDecisionParams) -> dict[str, Any]:
    decision = await repository.load_one(ctx.session, p.id)
    now = ctx.services.runtime.now()
    repository.add_review(
        ctx.session,
        decision,
        outcome=p.outcome,
        actual_result=p.actual_result,
        lessons=p.lessons,
        notes=p.notes,
        affected_kpis=p.affected_kpis,
        reviewed_by=ctx.agent,
        reviewed_at=now,
    )
    relay = ctx.services.relay
    events = relay.enqueue(ctx.session, decision.id)
    await ctx.session.flush()
    result: dict[str, Any] = {
        "success": True,
        "id": decision.id,
        "path": document.relative_path(decision),
        "status": "reviewed",
        "reviewedAt": iso(now),
        "reindexed": False,
    }
    index_event = next(e.id for e in events if e.kind == EventKind.INDEX)

    async def deliver() -> None:
        stats = await relay.process(events, [decision])
        result["reindexed"] = index_event in stats.done_ids

    ctx.on_commit(deliver)
    return result


async def review_history(session: AsyncSession, decision_id: str) -> list[dict[str, Any]]:
    """The decision's reviews, oldest first, as getDecision answers them."""
    return [
        {
            "outcome": r.outcome,
            "actualResult": r.actual_result,
            "lessons": r.lessons,
            "notes": r.notes,
            "affectedKpis": r.affected_kpis,
            "reviewedBy": r.reviewed_by,
            "reviewedAt": iso(r.reviewed_at),
        }
        for r in await repository.review_rows(session, decision_id)
    ]
