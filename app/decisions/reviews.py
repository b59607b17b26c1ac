"""cstp.reviewDecision: every review is kept; the decision row shows the latest.

The latest is the review with the greatest id (app.decisions.repository, "which review is the
latest"): a review locks the decision's row first and reads the clock after the lock, so
concurrent reviews of one decision, in any number of server processes, are made one after the
other, each copied into the row over the one before it. Its time is kept later than every
earlier review's: a clock that reads earlier (set back, or another process's clock behind this
one's) gives the time just after the last review's instead, so ``reviewed_at`` follows the
same order as the ids and can stand in for them where a review id is not at hand (the YAML
file: app.decisions.export).

An agent reviews the decisions it recorded (scope ``review:own``); any decision needs
``review:any`` (a reviewer's token), so that no agent can rewrite the outcomes another's
calibration is computed from.

The refreshed YAML file and index entry go through the outbox, built by the same document
functions as at record time, so no field is dropped and the outcome becomes filterable.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from app.db.outbox import EventKind
from app.errors import forbidden
from app.operations.context import CONSOLE, CallContext
from app.runtime import iso
from app.scopes import REVIEW_ANY

from . import document, repository
from .schemas import ReviewDecisionParams, ReviewDecisionResult

AFTER = timedelta(microseconds=1)  # the step both databases store a time to


def review_time(now: datetime, last: datetime | None) -> datetime:
    """A new review's time: the clock's, kept later than the decision's ``last`` review (a
    clock set back, or another process's behind), so reviews' times follow their order."""
    return last + AFTER if last is not None and now <= last else now


def source_of(ctx: CallContext) -> str:
    """Where the outcome comes from: a person's, given in the console (``human``), or the
    calling agent's own claim (``agent``) over JSON-RPC or MCP."""
    return "human" if ctx.face == CONSOLE else "agent"


async def review(ctx: CallContext, p: ReviewDecisionParams) -> ReviewDecisionResult:
    decision = await repository.lock_one(ctx.session, ctx.workspace, p.id)
    if decision.recorded_by != ctx.agent and not ctx.principal.may(REVIEW_ANY):
        raise forbidden(REVIEW_ANY, "reviewing a decision another agent recorded needs this scope")
    now = ctx.services.runtime.now()  # after the lock: the reviews' times follow their order
    now = review_time(now, await repository.last_review_time(ctx.session, decision.id))
    review = repository.add_review(
        ctx.session,
        decision,
        outcome=p.outcome,
        actual_result=p.actual_result,
        lessons=p.lessons,
        notes=p.notes,
        affected_kpis=p.affected_kpis,
        reviewed_by=ctx.agent,
        reviewed_at=now,
        source=source_of(ctx),
    )
    relay = ctx.services.relay
    events = relay.enqueue(ctx.session, decision.id, decision.workspace)
    await ctx.session.flush()
    ctx.trace("gen_ai.memory.record.id", decision.id)
    ctx.trace("cstp.review.outcome", p.outcome)
    ctx.trace_row("decision_reviews", str(review.id))
    result = ReviewDecisionResult(
        success=True,
        id=decision.id,
        path=document.relative_path(decision),
        status="reviewed",
        reviewed_at=iso(now),
        reindexed=False,
    )
    index_event = next(e.id for e in events if e.kind == EventKind.INDEX)

    async def deliver() -> None:
        stats = await relay.process(events, [decision])
        result.reindexed = index_event in stats.done_ids

    ctx.on_commit(deliver)
    return result
