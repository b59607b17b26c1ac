"""One place that turns a decision row into what the outside world sees of it.

The YAML export and the wire shapes are built here, from the row, so record, review and
import can never drift apart; the vector index entry and the short form in a list of results
are app.records.entries' (the search and the outbox relay build them too). The rows are read
and written by app.decisions.repository.
"""

from __future__ import annotations

import re
from typing import Any, cast

from app.db.base import DEFAULT_WORKSPACE
from app.db.decisions import Decision, DecisionReview
from app.records.entries import list_item, reasons_of, reasons_out, tags_of
from app.runtime import iso
from app.wire import Outcome, ReviewSource, Stakes, Status

from .schemas import DecisionOut, ListedDecision, MentalState, PreDecisionOut, ReviewOut

SUMMARY_LENGTH = 120


def summarize(text: str) -> str:
    """A one-line title: whitespace folded, cut at a word near SUMMARY_LENGTH characters."""
    flat = re.sub(r"\s+", " ", text).strip()
    if len(flat) <= SUMMARY_LENGTH:
        return flat
    cut = flat[:SUMMARY_LENGTH].rsplit(" ", 1)[0] or flat[:SUMMARY_LENGTH]
    return cut.rstrip(" ,.;:") + "…"


def relative_path(decision: Decision) -> str:
    """``decisions/YYYY/MM/YYYY-MM-DD-decision-<id>.yaml`` for workspace ``default``, and
    ``decisions/<workspace>/YYYY/MM/…`` for any other: only the row's workspace (an id of
    ``[a-z0-9][a-z0-9-]*``, checked where tokens are made), date and id."""
    created = decision.created_at
    # The year zero-padded by hand: strftime's %Y gives "1", not "0001", for the year 1 here.
    year, month, day = f"{created.year:04d}", f"{created.month:02d}", f"{created.day:02d}"
    root = (
        "decisions/"
        if decision.workspace == DEFAULT_WORKSPACE
        else (f"decisions/{decision.workspace}/")
    )
    return f"{root}{year}/{month}/{year}-{month}-{day}-decision-{decision.id}.yaml"


def _pre_decision(d: Decision) -> dict[str, Any]:
    values = {
        "query_run": d.pre_query_run,
        "similar_found": d.pre_similar_found,
        "guardrails_checked": d.pre_guardrails_checked,
        "guardrails_passed": d.pre_guardrails_passed,
    }
    return {k: v for k, v in values.items() if v is not None}


def export_fields(d: Decision) -> dict[str, Any]:
    """The canonical YAML mapping, in the key order of docs/PROTOCOL.md ("Decision files"),
    empty keys left out."""
    fields: dict[str, Any] = {
        "id": d.id,
        # only another workspace's files name theirs: ``default``'s stay as they always were
        "workspace": None if d.workspace == DEFAULT_WORKSPACE else d.workspace,
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


def wire(d: Decision, reviews: list[DecisionReview]) -> DecisionOut:
    """Every stored field of a decision, camelCase, and its reviews (the latest last), for
    getDecision. The row's enumerations hold only the values its params allowed (cast, not
    checked again)."""
    return DecisionOut(
        id=d.id,
        title=d.summary,
        summary=d.summary,
        decision=d.decision,
        category=d.category,
        confidence=d.confidence,
        stakes=cast(Stakes, d.stakes),
        status=cast(Status, d.status),
        date=iso(d.created_at),
        created_at=iso(d.created_at),
        context=d.context,
        reasons=reasons_out(d),
        kpi_indicators=list(d.kpi_indicators or []),
        mental_state=cast(MentalState | None, d.mental_state),
        review_in=d.review_in,
        review_by=iso(d.review_by) if d.review_by else None,
        tags=tags_of(d),
        pre_decision=PreDecisionOut(
            query_run=d.pre_query_run,
            similar_found=d.pre_similar_found,
            guardrails_checked=d.pre_guardrails_checked,
            guardrails_passed=d.pre_guardrails_passed,
        ),
        recorded_by=d.recorded_by,
        project=d.project,
        feature=d.feature,
        pr=d.pr,
        file=d.file,
        line=d.line,
        commit=d.commit,
        outcome=cast(Outcome | None, d.outcome),
        reviewed_at=iso(d.reviewed_at) if d.reviewed_at else None,
        reviewed_by=d.reviewed_by,
        actual_result=d.actual_result,
        lessons=d.lessons,
        review_notes=d.review_notes,
        affected_kpis=d.affected_kpis,
        intent_id=d.intent_id,
        correlation_id=d.correlation_id,
        guardrail_evaluation_id=d.guardrail_evaluation_id,
        path=relative_path(d),
        reviews=[review_out(r) for r in reviews],
        superseded_by=d.superseded_by,
        supersedes=[link.superseded_id for link in d.supersedes],
    )


def review_out(r: DecisionReview) -> ReviewOut:
    """One review as getDecision lists it."""
    return ReviewOut(
        outcome=cast(Outcome, r.outcome),
        actual_result=r.actual_result,
        lessons=r.lessons,
        notes=r.notes,
        affected_kpis=r.affected_kpis,
        reviewed_by=r.reviewed_by,
        reviewed_at=iso(r.reviewed_at),
        source=cast(ReviewSource, r.source),
    )


def listed(d: Decision) -> ListedDecision:
    """A listDecisions item: the short form, plus the client's correlationId when it has one."""
    return list_item(d, ListedDecision, correlation_id=d.correlation_id)
