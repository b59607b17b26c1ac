"""The console's own rows and reads: its sessions (app.console.sessions), and what it shows
that no operation answers: a decision's intent and evaluations, the recent evaluations and
intents, the chain's head, each of one workspace (audit scope), and Brier by month. Short
indexed reads, each in one read transaction."""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, String, delete, func, or_, select, update

from app.audit.verify import entry_problems
from app.calibration import repository as calibration
from app.calibration.schemas import Filters
from app.db.audit import AuditEntry
from app.db.console import ConsoleSession
from app.db.decisions import DecisionReview, DecisionSupersede
from app.db.engine import Database
from app.db.guardrails import GuardrailEvaluation
from app.db.intents import Intent

RECENT = 25

_EVALUATION_COLUMNS = (
    GuardrailEvaluation.id,
    GuardrailEvaluation.agent,
    GuardrailEvaluation.source,
    GuardrailEvaluation.evaluated_at,
    GuardrailEvaluation.description,
    GuardrailEvaluation.allowed,
    GuardrailEvaluation.violations,
    GuardrailEvaluation.warnings,
)
_INTENT_COLUMNS = (
    Intent.id,
    Intent.correlation_id,
    Intent.agent,
    Intent.received_at,
    Intent.outcome,
    Intent.error_code,
    Intent.intent,
    Intent.category,
    Intent.allowed,
    Intent.evaluation_id,
)


async def add_session(db: Database, row: ConsoleSession, forget_before: datetime) -> None:
    """Store a new session, deleting those that ended or expired before ``forget_before``."""
    async with db.transaction(write=True) as session:
        await session.execute(
            delete(ConsoleSession).where(ConsoleSession.expires_at < forget_before)
        )
        await session.execute(delete(ConsoleSession).where(ConsoleSession.ended_at < forget_before))
        session.add(row)


async def session(db: Database, session_id: str) -> ConsoleSession | None:
    async with db.transaction(write=False) as tx:
        found: ConsoleSession | None = await tx.scalar(
            select(ConsoleSession).where(ConsoleSession.id == session_id)
        )
        return found


async def end_session(db: Database, session_id: str, now: datetime) -> None:
    async with db.transaction(write=True) as tx:
        await tx.execute(
            update(ConsoleSession)
            .where(ConsoleSession.id == session_id, ConsoleSession.ended_at.is_(None))
            .values(ended_at=now)
        )


async def brier_by_month(
    db: Database, workspace: str, agent: str | None, category: str | None, edges: list[datetime]
) -> list[tuple[float | None, int]]:
    """Brier score and scored count of the decisions made between each two ``edges``,
    scored as getCalibration scores them (app.calibration.repository)."""
    out: list[tuple[float | None, int]] = []
    async with db.transaction(write=False) as tx:
        for start, end in itertools.pairwise(edges):
            f = Filters(agent=agent, category=category, since=start, until=end)
            ((_, sums),) = await calibration.aggregate(tx, workspace, f, None)
            out.append((sums.sum_squared_error / sums.scored if sums.scored else None, sums.scored))
    return out


def _rows(conn: Connection, statement: Any) -> list[dict[str, Any]]:
    return [dict(row) for row in conn.execute(statement).mappings()]


async def linked(
    db: Database, workspace: str, decision: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The intents a decision came from (its ``intentId``, or the same agent's announcements
    of its ``correlationId``) and the guardrail evaluations of those and of the decision."""
    intent_id = decision.get("intentId")
    correlation = decision.get("correlationId")

    def work(conn: Connection) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        which = []
        if intent_id:
            which.append(Intent.id == intent_id)
        if correlation:
            which.append(
                (Intent.correlation_id == correlation) & (Intent.agent == decision["recordedBy"])
            )
        intents = []
        if which:
            intents = _rows(
                conn,
                select(*_INTENT_COLUMNS)
                .where(Intent.workspace == workspace, or_(*which))
                .order_by(Intent.received_at)
                .limit(RECENT),
            )
        ids = {i["evaluation_id"] for i in intents if i["evaluation_id"]}
        if decision.get("guardrailEvaluationId"):
            ids.add(decision["guardrailEvaluationId"])
        evaluations = []
        if ids:
            evaluations = _rows(
                conn,
                select(*_EVALUATION_COLUMNS)
                .where(GuardrailEvaluation.workspace == workspace, GuardrailEvaluation.id.in_(ids))
                .order_by(GuardrailEvaluation.evaluated_at),
            )
        return intents, evaluations

    return await db.read(work)


async def recent_evaluations(db: Database, workspace: str) -> list[dict[str, Any]]:
    statement = (
        select(*_EVALUATION_COLUMNS)
        .where(GuardrailEvaluation.workspace == workspace)
        .order_by(GuardrailEvaluation.evaluated_at.desc())
        .limit(RECENT)
    )
    return await db.read(lambda conn: _rows(conn, statement))


async def recent_intents(db: Database, workspace: str) -> list[dict[str, Any]]:
    statement = (
        select(*_INTENT_COLUMNS)
        .where(Intent.workspace == workspace)
        .order_by(Intent.received_at.desc())
        .limit(RECENT)
    )
    return await db.read(lambda conn: _rows(conn, statement))


async def decision_entries(
    db: Database, workspace: str, decision_id: str, secret: bytes | None
) -> list[dict[str, Any]]:
    """The chain entries of a decision, its reviews and its supersede links, each with
    whether its hash and its row still hold (app.audit.verify.entry_problems)."""

    def work(conn: Connection) -> list[dict[str, Any]]:
        reviews = select(func.cast(DecisionReview.id, String)).where(
            DecisionReview.decision_id == decision_id
        )
        links = select(func.cast(DecisionSupersede.id, String)).where(
            DecisionSupersede.decision_id == decision_id
        )
        entries = conn.execute(
            select(AuditEntry)
            .where(
                AuditEntry.workspace == workspace,
                or_(
                    (AuditEntry.table_name == "decisions") & (AuditEntry.row_id == decision_id),
                    (AuditEntry.table_name == "decision_reviews") & AuditEntry.row_id.in_(reviews),
                    (AuditEntry.table_name == "decision_supersedes") & AuditEntry.row_id.in_(links),
                ),
            )
            .order_by(AuditEntry.seq)
        ).all()
        problems = {p.seq: p.detail for p in entry_problems(conn, entries, secret)}
        return [
            {"seq": e.seq, "table": e.table_name, "hash": e.hash, "problem": problems.get(e.seq)}
            for e in entries
        ]

    return await db.read(work)


async def chain_head(db: Database, workspace: str) -> dict[str, Any] | None:
    """The workspace's latest chain entry and how many it has; None before its first."""

    def work(conn: Connection) -> dict[str, Any] | None:
        last = conn.execute(
            select(AuditEntry.seq, AuditEntry.hash, AuditEntry.table_name, AuditEntry.keyed)
            .where(AuditEntry.workspace == workspace)
            .order_by(AuditEntry.seq.desc())
            .limit(1)
        ).first()
        if last is None:
            return None
        count = conn.scalar(
            select(func.count()).select_from(AuditEntry).where(AuditEntry.workspace == workspace)
        )
        return {**last._mapping, "entries": int(count or 0)}

    return await db.read(work)
