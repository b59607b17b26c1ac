"""Approvals: asked for by an escalated evaluation, answered once by another agent with the
``approve`` scope, expired by time (SPEC.md, section 8).

An approval's status is never stored: it is its decision's verdict, else ``expired`` once its
deadline has passed, else ``pending`` (``status_of``), computed at every read, in SQL for
lists. So a pending approval past its deadline reads as expired in every server process,
whether or not its expiry row is written yet (app.approvals.expiry writes it, for the chain).

The guardrail answers (checkGuardrails, announceIntent) call ``resolve`` when an evaluation
escalates: it asks for a new approval, or reports the one this request already has (the
agent's re-announcement of a correlationId, checkGuardrails' ``approvalId``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any, TypeVar

from sqlalchemy import Connection, Row
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app import scopes
from app.audit.canonical import Covered, covered
from app.audit.chain import append
from app.db.approvals import APPROVED, DENIED, EXPIRED, PENDING
from app.db.engine import Database
from app.errors import DECISION_NOT_FOUND, CstpError, conflict, forbidden
from app.operations.context import CallContext
from app.runtime import iso
from app.webhooks import APPROVAL_DECIDED, APPROVAL_REQUESTED, Message, enqueue_many, message

from . import repository
from .schemas import (
    ApprovalOut,
    ApprovalResult,
    DecideApprovalParams,
    Escalation,
    GetApprovalParams,
    ListApprovalsParams,
    ListApprovalsResult,
)

T = TypeVar("T")


def status_of(verdict: str | None, expires_at: datetime, now: datetime) -> str:
    """An approval's status: its decision's verdict, else expired from its deadline on."""
    if verdict is not None:
        return verdict
    return EXPIRED if now >= expires_at else PENDING


async def counts(db: Database, now: datetime) -> dict[str, int]:
    """How many approvals of every workspace have each status now (the metrics'
    ``cstp_approvals``), every status included."""
    async with db.transaction(write=False) as session:
        found = await repository.count_by_status(session, now)
    return {status: found.get(status, 0) for status in (PENDING, APPROVED, DENIED, EXPIRED)}


def action_sha256(action: Mapping[str, Any]) -> str:
    """What makes two requests "the same action": the SHA-256 of its canonical JSON."""
    blob = json.dumps(action, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def not_found(approval_id: str) -> CstpError:
    """An approval that is not there, or not the caller's to see: the same answer (-32007)."""
    return CstpError(DECISION_NOT_FOUND, "Approval not found", {"id": approval_id})


@dataclass(frozen=True)
class Requested:
    """A new approval's row, built (and digested) but not written."""

    row: dict[str, Any]
    entry: Covered

    def escalation(self) -> Escalation:
        return Escalation(
            approval_id=self.row["id"],
            status="pending",
            expires_at=iso(self.row["expires_at"]),
            rules=list(self.row["rules"]),
        )


def resolve(
    ctx: CallContext,
    *,
    existing: Row[Any] | None,
    evaluation_id: str,
    source: str,
    correlation_id: str | None,
    action: Mapping[str, Any],
    rules: Sequence[str],
    timeout: int,
    renew: bool,
) -> tuple[Escalation, Requested | None]:
    """What an escalated evaluation answers: the approval this request already has
    (``existing``: -32008 when it was asked for another action), or a new one, pending for
    ``timeout`` seconds, to be written with the evaluation.

    An approval covers the escalate rules it was asked for: when a rule fires now that it
    did not name (a rule added since), it does not answer for them. Then, with ``renew``
    (checkGuardrails: an approval per request), a new approval is asked for every rule that
    fires; without (a correlationId has one approval), -32008."""
    digest = action_sha256(action)
    runtime = ctx.services.runtime
    if existing is not None:
        if existing.action_sha256 != digest:
            raise conflict(
                "Conflict: this approval was asked for a different action (its description, "
                "category, stakes, confidence, project or facts differ)",
                {"approvalId": existing.id},
            )
        uncovered = [r for r in rules if r not in existing.rules]
        if uncovered and not renew:
            raise conflict(
                "Conflict: escalate rules that this approval was not asked for fire now; "
                "announce under a new correlationId to ask for them",
                {"approvalId": existing.id, "rules": uncovered},
            )
        if uncovered:
            existing = None
    if existing is not None:
        status = status_of(existing.verdict, existing.expires_at, runtime.now())
        return (
            Escalation(
                approval_id=existing.id,
                status=status,  # type: ignore[arg-type]  # one of ApprovalStatus
                expires_at=iso(existing.expires_at),
                rules=list(existing.rules),
            ),
            None,
        )
    now = runtime.now()
    row = {
        "id": runtime.uuid(),
        "workspace": ctx.workspace,
        "evaluation_id": evaluation_id,
        "source": source,
        "requested_by": ctx.agent,
        "correlation_id": correlation_id,
        "action": dict(action),
        "action_sha256": digest,
        "rules": list(rules),
        "created_at": now,
        "expires_at": now + timedelta(seconds=timeout),
    }
    requested = Requested(row, covered("approvals", row))
    return requested.escalation(), requested


async def _read(ctx: CallContext, work: Callable[[Connection], T]) -> T:
    return await ctx.services.db.read(work, session=ctx.open_session)


async def by_correlation(ctx: CallContext, correlation_id: str) -> Row[Any] | None:
    """The approval the caller asked for under ``correlation_id``, if any."""
    return await _read(
        ctx,
        lambda conn: repository.by_correlation(
            conn, workspace=ctx.workspace, agent=ctx.agent, correlation_id=correlation_id
        ),
    )


async def own(ctx: CallContext, approval_id: str) -> Row[Any]:
    """The approval ``approval_id`` that the caller asked for (checkGuardrails' ``approvalId``);
    -32007 when there is none in its workspace, or another agent asked for it."""
    row = await _read(
        ctx,
        lambda conn: repository.by_id(conn, workspace=ctx.workspace, approval_id=approval_id),
    )
    if row is None or row.requested_by != ctx.agent:
        raise not_found(approval_id)
    return row


async def store(session: AsyncSession, requested: Sequence[Requested]) -> None:
    """Write new approvals in the caller's transaction, with their chain entries and their
    ``approval.requested`` webhooks."""
    if not requested:
        return
    await repository.insert_approvals(session, [r.row for r in requested])
    append(session, *(r.entry for r in requested))
    await notify_requested(session, requested)


async def notify_requested(session: AsyncSession, requested: Sequence[Requested]) -> None:
    """The ``approval.requested`` webhooks of approvals written in ``session``'s transaction
    (one per approval: its message id is the approval's)."""
    if requested:
        await enqueue_many(session, [_requested_message(r.row) for r in requested])


def _requested_message(row: Mapping[str, Any]) -> Message:
    data = {
        "approvalId": row["id"],
        "workspace": row["workspace"],
        "requestedBy": row["requested_by"],
        "correlationId": row["correlation_id"],
        "action": row["action"],
        "rules": row["rules"],
        "createdAt": row["created_at"],
        "expiresAt": row["expires_at"],
        "evaluationId": row["evaluation_id"],
    }
    return message(
        workspace=row["workspace"],
        event=APPROVAL_REQUESTED,
        data=data,
        at=row["created_at"],
        message_id=f"msg_approval_requested_{row['id']}",
    )


def decided_message(approval: Any, decision: Mapping[str, Any]) -> Message:
    """The ``approval.decided`` webhook of ``decision`` (approved, denied or expired) of
    ``approval`` (a row of ``repository``)."""
    data = {
        "approvalId": approval.id,
        "workspace": approval.workspace,
        "status": decision["verdict"],
        "decidedBy": decision["decided_by"],
        "decidedAt": decision["decided_at"],
        "reason": decision["reason"],
        "requestedBy": approval.requested_by,
        "correlationId": approval.correlation_id,
        "rules": list(approval.rules),
    }
    return message(
        workspace=approval.workspace,
        event=APPROVAL_DECIDED,
        data=data,
        at=decision["decided_at"],
        message_id=f"msg_approval_decided_{approval.id}",
    )


def out(row: Any, now: datetime) -> ApprovalOut:
    """An approval as the methods answer it, from a row of ``repository`` (or an object with
    its attributes)."""
    return ApprovalOut(
        id=row.id,
        status=status_of(row.verdict, row.expires_at, now),  # type: ignore[arg-type]
        requested_by=row.requested_by,
        correlation_id=row.correlation_id,
        action=row.action,
        rules=list(row.rules),
        created_at=iso(row.created_at),
        expires_at=iso(row.expires_at),
        evaluation_id=row.evaluation_id,
        decided_at=None if row.decided_at is None else iso(row.decided_at),
        decided_by=row.decided_by,
        reason=row.reason,
    )


def _sees_all(ctx: CallContext) -> bool:
    return ctx.principal.may(scopes.APPROVE) or ctx.principal.may(scopes.AUDIT)


async def _in_workspace(ctx: CallContext, approval_id: str) -> Row[Any]:
    session = ctx.session
    row = await session.run_sync(
        lambda s: repository.by_id(s.connection(), workspace=ctx.workspace, approval_id=approval_id)
    )
    if row is None:
        raise not_found(approval_id)
    return row


async def get(ctx: CallContext, p: GetApprovalParams) -> ApprovalResult:
    """An approval: any of the workspace's for an approver or auditor, else only the caller's
    own requests (another's answers as one that does not exist)."""
    row = await _in_workspace(ctx, p.id)
    if row.requested_by != ctx.agent and not _sees_all(ctx):
        raise not_found(p.id)
    return ApprovalResult(approval=out(row, ctx.services.runtime.now()))


async def listing(ctx: CallContext, p: ListApprovalsParams) -> ListApprovalsResult:
    now = ctx.services.runtime.now()
    rows, total = await ctx.session.run_sync(
        lambda s: repository.listing(
            s.connection(),
            workspace=ctx.workspace,
            status=p.status,
            now=now,
            limit=p.limit,
            offset=p.offset,
        )
    )
    return ListApprovalsResult(approvals=[out(r, now) for r in rows], total=total)


async def decide(ctx: CallContext, p: DecideApprovalParams) -> ApprovalResult:
    """Approve or deny a pending approval, once. Four eyes: the agent that asked can never
    decide (-32010). Decided or expired: -32008. The clock is read after the approval's row
    is read in this write transaction (on SQLite the write lock is held from that read on)."""
    row = await _in_workspace(ctx, p.id)
    if row.requested_by == ctx.agent:
        raise forbidden(
            scopes.APPROVE, "an approval cannot be decided by the agent that asked for it"
        )
    now = ctx.services.runtime.now()
    status = status_of(row.verdict, row.expires_at, now)
    if status != PENDING:
        raise conflict(
            f"Conflict: this approval is already {status}", {"id": p.id, "status": status}
        )
    decision = {
        "approval_id": row.id,
        "workspace": ctx.workspace,
        "verdict": APPROVED if p.verdict == "approve" else DENIED,
        "decided_by": ctx.agent,
        "decided_at": now,
        "reason": p.reason,
    }
    try:
        async with ctx.session.begin_nested():
            await repository.insert_decision(ctx.session, decision)
    except IntegrityError:  # another process decided it (or wrote its expiry) first
        raise conflict(
            "Conflict: this approval was decided by another call", {"id": p.id}
        ) from None
    append(ctx.session, covered("approval_decisions", decision))
    await enqueue_many(ctx.session, [decided_message(row, decision)])
    decided = SimpleNamespace(**{**row._asdict(), **decision})
    return ApprovalResult(approval=out(decided, now))
