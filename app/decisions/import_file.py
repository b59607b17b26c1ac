"""One decision YAML file read into an unsaved ``Decision`` (for ``cstp import``).

The layout is docs/PROTOCOL.md's ("Decision files"), which other decision journals also write:
keys this server does not know are ignored, and a file that cannot be read, or whose values no
column could hold, raises ``Unreadable`` with the reason to show the operator.

This module maps the file's keys to a decision's columns, reasons, tags and review
(``parse_file``) and gives the decision its id (``decision_id``). Reading each value as its
column can hold it is app.decisions.import_values; the limits on the whole file and decision
(size, YAML aliases, the API's own limits) and ``Unreadable`` are app.decisions.import_limits.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import yaml

from app.db.decisions import Decision, DecisionReason, DecisionTag

from .document import summarize
from .import_limits import Unreadable, _Loader, _refuse_aliases, _within_api_limits, read_capped
from .import_values import (
    MENTAL_STATES,
    OUTCOMES,
    REASON_TYPES,
    STAKES,
    TAG_LENGTH,
    _checked,
    _choice,
    _correlation_id,
    _flag,
    _int,
    _json_mapping,
    _list,
    _scalars,
    _text,
    _when,
)

HEX_ID = re.compile(r"[0-9a-f]{8}")


def decision_id(data: dict[str, Any], content: bytes) -> str:
    """The file's own id when it is ours (8 hex), else a stable id derived from it."""
    raw = data.get("id")
    if isinstance(raw, str) and HEX_ID.fullmatch(raw):
        return raw
    basis = str(raw).encode() if raw is not None else content
    return hashlib.sha256(b"cstp-import:" + basis).hexdigest()[:8]


def parse_file(path: Path, categories: tuple[str, ...], max_bytes: int) -> Decision:
    content = read_capped(path, max_bytes)
    _refuse_aliases(content)
    try:
        data = yaml.load(content, Loader=_Loader)  # a SafeLoader
    except yaml.YAMLError as exc:
        if "nesting depth" in str(getattr(exc, "problem", "")):  # libyaml's own limit
            raise Unreadable("nested too deeply") from None
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise Unreadable(f"not valid YAML{where}") from None
    except RecursionError:
        raise Unreadable("nested too deeply") from None
    except (ValueError, OverflowError) as exc:  # e.g. a date 2025-02-30 (PyYAML's own)
        raise Unreadable(f"a value cannot be read: {str(exc)[:200]}") from None
    if not isinstance(data, dict):
        raise Unreadable("not a mapping of decision fields")
    text = _text(data, "decision") or _text(data, "summary") or _text(data, "title")
    if not text or not text.strip():
        raise Unreadable("decision: missing")
    confidence = data.get("confidence")
    if (
        isinstance(confidence, bool)
        or not isinstance(confidence, (int, float))
        or not (
            0.0 <= confidence <= 1.0  # compared as it is: float() of a huge int overflows
        )
    ):
        raise Unreadable("confidence: must be a number between 0.0 and 1.0")
    category = _choice(data.get("category"), set(categories), "category")
    if category is None:
        raise Unreadable("category: missing")
    created = _when(data.get("date") or data.get("created_at"), "date")
    if created is None:
        raise Unreadable("date: missing")
    decision = Decision(
        id=decision_id(data, content),
        summary=_text(data, "summary") or summarize(text),
        decision=text.strip(),
        category=category,
        confidence=float(confidence),
        stakes=_choice(data.get("stakes"), STAKES, "stakes", "medium"),
        status="pending",
        created_at=created,
        recorded_by=_text(data, "recorded_by") or "import",
        context=_text(data, "context"),
        mental_state=_choice(data.get("mental_state"), MENTAL_STATES, "mental_state"),
        review_by=_when(data.get("review_by"), "review_by"),
        kpi_indicators=_scalars(data, "kpi_indicators") or None,
        project=_text(data, "project"),
        feature=_text(data, "feature"),
        pr=_int(data, "pr"),
        file=_text(data, "file"),
        line=_int(data, "line"),
        commit=_text(data, "commit"),
        correlation_id=_correlation_id(data),
    )
    pre = data.get("pre_decision")
    if isinstance(pre, dict):
        decision.pre_query_run = _flag(pre, "query_run")
        decision.pre_similar_found = _int(pre, "similar_found")
        decision.pre_guardrails_checked = _flag(pre, "guardrails_checked")
        decision.pre_guardrails_passed = _flag(pre, "guardrails_passed")
    decision.reasons = [_reason(i, r) for i, r in enumerate(_list(data, "reasons"))]
    tags = [t for t in _scalars(data, "tags", TAG_LENGTH) if t.strip()]
    decision.tags = [DecisionTag(tag=t, position=i) for i, t in enumerate(dict.fromkeys(tags))]
    _apply_review(decision, data)
    _within_api_limits(decision)
    return decision


def _reason(position: int, raw: Any) -> DecisionReason:
    if not isinstance(raw, dict) or not isinstance(raw.get("text"), str):
        raise Unreadable(f"reasons[{position}]: needs a text")
    strength = raw.get("strength", 0.8)
    if (
        isinstance(strength, bool)
        or not isinstance(strength, (int, float))
        or not (0.0 <= strength <= 1.0)
    ):
        raise Unreadable(f"reasons[{position}].strength: must be a number between 0.0 and 1.0")
    kind = _choice(raw.get("type", "analysis"), REASON_TYPES, f"reasons[{position}].type")
    text = _checked(raw["text"], f"reasons[{position}].text", None)
    return DecisionReason(position=position, type=kind, text=text, strength=float(strength))


def _apply_review(decision: Decision, data: dict[str, Any]) -> None:
    outcome = _choice(data.get("outcome"), OUTCOMES, "outcome")
    if outcome is None:
        return
    decision.status = "reviewed"
    decision.outcome = outcome
    decision.reviewed_at = _when(data.get("reviewed_at"), "reviewed_at") or decision.created_at
    decision.reviewed_by = _text(data, "reviewed_by") or decision.recorded_by
    decision.actual_result = _text(data, "actual_result")
    decision.lessons = _text(data, "lessons")
    decision.review_notes = _text(data, "review_notes")
    decision.affected_kpis = _json_mapping(data.get("affected_kpis"), "affected_kpis")
