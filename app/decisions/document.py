"""One place that turns a decision row into what the outside world sees of it.

The YAML export, the vector index entry and the wire shape are all built here, from the row,
so record, review, reindex and import can never drift apart.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import selectinload

from app.db.decisions import Decision, DecisionReason, DecisionTag
from app.errors import decision_not_found
from app.runtime import iso
from app.search.filters import tag_metadata
from app.search.types import IndexEntry

SUMMARY_LENGTH = 120


def summarize(text: str) -> str:
    """A one-line title: whitespace folded, cut at a word near SUMMARY_LENGTH characters."""
    flat = re.sub(r"\s+", " ", text).strip()
    if len(flat) <= SUMMARY_LENGTH:
        return flat
    cut = flat[:SUMMARY_LENGTH].rsplit(" ", 1)[0] or flat[:SUMMARY_LENGTH]
    return cut.rstrip(" ,.;:") + "…"


def relative_path(decision: Decision) -> str:
    """``decisions/YYYY/MM/YYYY-MM-DD-decision-<id>.yaml``: only the row's date and id."""
    created = decision.created_at
    # The year zero-padded by hand: strftime's %Y gives "1", not "0001", for the year 1 here.
    year, month, day = f"{created.year:04d}", f"{created.month:02d}", f"{created.day:02d}"
    return f"decisions/{year}/{month}/{year}-{month}-{day}-decision-{decision.id}.yaml"


@dataclass(slots=True)
class Brief:
    """A decision as a search reads it: these columns as plain values (no ORM object to build
    or track), then its tags and reasons when the search asked for them. ``list_item``,
    ``index_metadata`` and ``reasons_of`` read it like a ``Decision``."""

    id: str
    summary: str
    category: str
    confidence: float
    stakes: str
    status: str
    created_at: datetime
    recorded_by: str
    project: str | None
    feature: str | None
    pr: int | None
    outcome: str | None
    actual_result: str | None
    lessons: str | None
    review_notes: str | None
    tag_names: list[str] = field(default_factory=list)
    reasons: list[Any] = field(default_factory=list)


# What a search reads of a row: the columns named by Brief's fields, in that order.
SEARCH_COLUMNS = tuple(
    getattr(Decision, f.name) for f in fields(Brief) if f.name not in ("tag_names", "reasons")
)

# Built once: building a statement (and its cache key) costs more than running it here.
_BRIEFS = select(*SEARCH_COLUMNS).where(Decision.id.in_(bindparam("ids", expanding=True)))
_TAGS = (
    select(DecisionTag.decision_id, DecisionTag.tag)
    .where(DecisionTag.decision_id.in_(bindparam("ids", expanding=True)))
    .order_by(DecisionTag.decision_id, DecisionTag.position)
)
_REASONS = (
    select(
        DecisionReason.decision_id,
        DecisionReason.type,
        DecisionReason.text,
        DecisionReason.strength,
    )
    .where(DecisionReason.decision_id.in_(bindparam("ids", expanding=True)))
    .order_by(DecisionReason.decision_id, DecisionReason.position)
)


def load_briefs(conn: Connection, ids: Sequence[str]) -> dict[str, Brief]:
    """SEARCH_COLUMNS of the rows with these ids (absent ids are left out); no tags yet."""
    if not ids:
        return {}
    return {row[0]: Brief(*row) for row in conn.execute(_BRIEFS, {"ids": list(ids)})}


def add_tags(conn: Connection, briefs: Sequence[Brief]) -> None:
    """Fill ``tag_names`` of ``briefs``, in each decision's tag order."""
    by_id = {b.id: b for b in briefs}
    if by_id:
        for decision_id, tag in conn.execute(_TAGS, {"ids": list(by_id)}):
            by_id[decision_id].tag_names.append(tag)


def add_reasons(conn: Connection, briefs: Sequence[Brief]) -> None:
    """Fill ``reasons`` of ``briefs`` (rows with type, text and strength), in order."""
    by_id = {b.id: b for b in briefs}
    if by_id:
        for row in conn.execute(_REASONS, {"ids": list(by_id)}):
            by_id[row.decision_id].reasons.append(row)


async def load_decisions(session: AsyncSession, ids: Sequence[str]) -> dict[str, Decision]:
    """Rows by id with every column, their tags and their reasons."""
    if not ids:
        return {}
    # Tags and reasons each by ``decision_id IN (...)``: a join would let Postgres hash-join
    # against a full scan of decision_tags, which grows with the corpus.
    rows = await session.scalars(
        select(Decision)
        .where(Decision.id.in_(list(ids)))
        .options(selectinload(Decision.tags), selectinload(Decision.reasons))
    )
    return {row.id: row for row in rows}


async def load_one(session: AsyncSession, decision_id: str) -> Decision:
    """One row as ``load_decisions`` loads it; -32007 (decision not found) when there is none."""
    found = await load_decisions(session, [decision_id])
    if decision_id not in found:
        raise decision_not_found(decision_id)
    return found[decision_id]


def tags_of(decision: Decision | Brief) -> list[str]:
    return list(decision.tag_names)


def reasons_of(decision: Decision | Brief) -> list[dict[str, Any]]:
    return [{"type": r.type, "text": r.text, "strength": r.strength} for r in decision.reasons]


def _pre_decision(d: Decision) -> dict[str, Any]:
    values = {
        "query_run": d.pre_query_run,
        "similar_found": d.pre_similar_found,
        "guardrails_checked": d.pre_guardrails_checked,
        "guardrails_passed": d.pre_guardrails_passed,
    }
    return {k: v for k, v in values.items() if v is not None}


def export_fields(d: Decision) -> dict[str, Any]:
    """The canonical YAML mapping, in SPEC.md section 3's key order, empty keys left out."""
    fields: dict[str, Any] = {
        "id": d.id,
        "summary": d.summary,
        "decision": d.decision,
        "category": d.category,
        "confidence": d.confidence,
        "stakes": d.stakes,
        "status": d.status,
        "date": iso(d.created_at),
        "context": d.context,
        "reasons": reasons_of(d),
        "kpi_indicators": list(d.kpi_indicators or []),
        "mental_state": d.mental_state,
        "review_by": iso(d.review_by) if d.review_by else None,
        "tags": tags_of(d),
        "pre_decision": _pre_decision(d),
        "correlation_id": d.correlation_id,
        "recorded_by": d.recorded_by,
        "project": d.project,
        "feature": d.feature,
        "pr": d.pr,
        "file": d.file,
        "line": d.line,
        "commit": d.commit,
        "outcome": d.outcome,
        "reviewed_at": iso(d.reviewed_at) if d.reviewed_at else None,
        "reviewed_by": d.reviewed_by,
        "actual_result": d.actual_result,
        "lessons": d.lessons,
        "review_notes": d.review_notes,
        "affected_kpis": dict(d.affected_kpis or {}),
    }
    return {k: v for k, v in fields.items() if v is not None and v != [] and v != {}}


def index_text(d: Decision) -> str:
    """The text that is embedded: the decision, its context and its reasons."""
    parts = [d.decision]
    if d.context:
        parts.append(d.context)
    parts.extend(r.text for r in d.reasons)
    return "\n".join(parts)


def index_entry(d: Decision) -> IndexEntry:
    """The vector index document and metadata."""
    return IndexEntry(id=d.id, document=index_text(d), metadata=index_metadata(d))


def index_metadata(d: Decision | Brief) -> dict[str, Any]:
    """The filterable metadata of the index entry; app.search.filters reads these keys."""
    metadata: dict[str, Any] = {
        "title": d.summary,
        "category": d.category,
        "stakes": d.stakes,
        "status": d.status,
        "confidence": float(d.confidence),
        "created_at": d.created_at.timestamp(),
        "date": iso(d.created_at),
        "agent": d.recorded_by,
        "project": d.project,
        "feature": d.feature,
        "pr": d.pr,
        "has_outcome": d.outcome is not None,
        "outcome": d.outcome,
    }
    metadata.update(tag_metadata(tags_of(d)))
    return {k: v for k, v in metadata.items() if v is not None}


def wire(d: Decision, *, reviews: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Every stored field of a decision, camelCase, for getDecision."""
    out: dict[str, Any] = {
        "id": d.id,
        "title": d.summary,
        "summary": d.summary,
        "decision": d.decision,
        "category": d.category,
        "confidence": d.confidence,
        "stakes": d.stakes,
        "status": d.status,
        "date": iso(d.created_at),
        "createdAt": iso(d.created_at),
        "context": d.context,
        "reasons": reasons_of(d),
        "kpiIndicators": list(d.kpi_indicators or []),
        "mentalState": d.mental_state,
        "reviewIn": d.review_in,
        "reviewBy": iso(d.review_by) if d.review_by else None,
        "tags": tags_of(d),
        "preDecision": {
            "queryRun": d.pre_query_run,
            "similarFound": d.pre_similar_found,
            "guardrailsChecked": d.pre_guardrails_checked,
            "guardrailsPassed": d.pre_guardrails_passed,
        },
        "recordedBy": d.recorded_by,
        "project": d.project,
        "feature": d.feature,
        "pr": d.pr,
        "file": d.file,
        "line": d.line,
        "commit": d.commit,
        "outcome": d.outcome,
        "reviewedAt": iso(d.reviewed_at) if d.reviewed_at else None,
        "reviewedBy": d.reviewed_by,
        "actualResult": d.actual_result,
        "lessons": d.lessons,
        "reviewNotes": d.review_notes,
        "affectedKpis": d.affected_kpis,
        "intentId": d.intent_id,
        "correlationId": d.correlation_id,
        "guardrailEvaluationId": d.guardrail_evaluation_id,
        "path": relative_path(d),
    }
    if reviews is not None:
        out["reviews"] = reviews
    return out


def list_item(d: Decision | Brief) -> dict[str, Any]:
    """The short form of a decision in a list (listDecisions; queryDecisions adds to it)."""
    item: dict[str, Any] = {
        "id": d.id,
        "title": d.summary,
        "category": d.category,
        "confidence": d.confidence,
        "stakes": d.stakes,
        "status": d.status,
        "date": iso(d.created_at),
        "agent": d.recorded_by,
        "tags": tags_of(d),
    }
    for key, value in (("outcome", d.outcome), ("project", d.project)):
        if value is not None:
            item[key] = value
    return item


def listed(d: Decision) -> dict[str, Any]:
    """A listDecisions item: the short form, plus the client's correlationId when it has one."""
    item = list_item(d)
    if d.correlation_id is not None:
        item["correlationId"] = d.correlation_id
    return item
