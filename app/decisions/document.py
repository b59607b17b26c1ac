"""One place that turns a decision row into what the outside world sees of it.

The YAML export and the wire shapes are built here, from the row, so record, review and
import can never drift apart; the vector index entry and the short form in a list of results
are app.records.entries' (the search and the outbox relay build them too). The rows are read
and written by app.decisions.repository.
"""

from __future__ import annotations

import re
from typing import Any

from app.db.decisions import Decision
from app.records.entries import list_item, reasons_of, tags_of
from app.runtime import iso

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


def listed(d: Decision) -> dict[str, Any]:
    """A listDecisions item: the short form, plus the client's correlationId when it has one."""
    item = list_item(d)
    if d.correlation_id is not None:
        item["correlationId"] = d.correlation_id
    return item
