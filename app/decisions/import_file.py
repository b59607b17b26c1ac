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

from app.db.base import DEFAULT_WORKSPACE
from app.db.decisions import Decision, DecisionReason, DecisionTag
from app.scopes import is_workspace_id

from .document import summarize
from .import_limits import SAFE_LOADER, Unreadable, read_capped, refuse_aliases, within_api_limits
from .import_values import (
    MENTAL_STATES,
    OUTCOMES,
    REASON_TYPES,
    STAKES,
    TAG_LENGTH,
    checked_text,
    choice_of,
    correlation_id_of,
    flag_at,
    int_at,
    json_mapping,
    list_at,
    scalars_at,
    text_at,
    when_of,
)

HEX_ID = re.compile(r"[0-9a-f]{8}")


def decision_id(data: dict[str, Any], content: bytes, workspace: str = DEFAULT_WORKSPACE) -> str:
    """The file's own id when it is ours (8 hex), else a stable id derived from it (and from
    its workspace, unless ``default``: two teams' journals may use the same ids)."""
    raw = data.get("id")
    if isinstance(raw, str) and HEX_ID.fullmatch(raw):
        return raw
    basis = str(raw).encode() if raw is not None else content
    if workspace != DEFAULT_WORKSPACE:
        basis = workspace.encode() + b":" + basis
    return hashlib.sha256(b"cstp-import:" + basis).hexdigest()[:8]


def _workspace_of(data: dict[str, Any], workspace: str) -> None:
    """A file that names a workspace is imported into that one only."""
    named = data.get("workspace", DEFAULT_WORKSPACE)
    if named == workspace:
        return
    if not is_workspace_id(named):
        raise Unreadable("workspace: not a workspace id")
    raise Unreadable(f"belongs to workspace {named}: import it with --workspace {named}")


def parse_file(
    path: Path, categories: tuple[str, ...], max_bytes: int, workspace: str = DEFAULT_WORKSPACE
) -> Decision:
    """The decision of one file, for ``workspace``."""
    content = read_capped(path, max_bytes)
    refuse_aliases(content)
    try:
        data = yaml.load(content, Loader=SAFE_LOADER)  # a SafeLoader
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
    _workspace_of(data, workspace)
    text = text_at(data, "decision") or text_at(data, "summary") or text_at(data, "title")
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
    category = choice_of(data.get("category"), set(categories), "category")
    if category is None:
        raise Unreadable("category: missing")
    created = when_of(data.get("date") or data.get("created_at"), "date")
    if created is None:
        raise Unreadable("date: missing")
    decision = Decision(
        id=decision_id(data, content, workspace),
        workspace=workspace,
        summary=text_at(data, "summary") or summarize(text),
        decision=text.strip(),
        category=category,
        confidence=float(confidence),
        stakes=choice_of(data.get("stakes"), STAKES, "stakes", "medium"),
        status="pending",
        created_at=created,
        recorded_by=text_at(data, "recorded_by") or "import",
        context=text_at(data, "context"),
        mental_state=choice_of(data.get("mental_state"), MENTAL_STATES, "mental_state"),
        review_by=when_of(data.get("review_by"), "review_by"),
        kpi_indicators=scalars_at(data, "kpi_indicators") or None,
        project=text_at(data, "project"),
        feature=text_at(data, "feature"),
        pr=int_at(data, "pr"),
        file=text_at(data, "file"),
        line=int_at(data, "line"),
        commit=text_at(data, "commit"),
        correlation_id=correlation_id_of(data),
    )
    pre = data.get("pre_decision")
    if isinstance(pre, dict):
        decision.pre_query_run = flag_at(pre, "query_run")
        decision.pre_similar_found = int_at(pre, "similar_found")
        decision.pre_guardrails_checked = flag_at(pre, "guardrails_checked")
        decision.pre_guardrails_passed = flag_at(pre, "guardrails_passed")
    decision.reasons = [_reason(i, r) for i, r in enumerate(list_at(data, "reasons"))]
    tags = [t for t in scalars_at(data, "tags", TAG_LENGTH) if t.strip()]
    decision.tags = [DecisionTag(tag=t, position=i) for i, t in enumerate(dict.fromkeys(tags))]
    for reason in decision.reasons:
        reason.workspace = workspace
    for tag in decision.tags:
        tag.workspace = workspace
    _apply_review(decision, data)
    within_api_limits(decision)
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
    kind = choice_of(raw.get("type", "analysis"), REASON_TYPES, f"reasons[{position}].type")
    text = checked_text(raw["text"], f"reasons[{position}].text", None)
    return DecisionReason(position=position, type=kind, text=text, strength=float(strength))


def _apply_review(decision: Decision, data: dict[str, Any]) -> None:
    outcome = choice_of(data.get("outcome"), OUTCOMES, "outcome")
    if outcome is None:
        return
    decision.status = "reviewed"
    decision.outcome = outcome
    decision.reviewed_at = when_of(data.get("reviewed_at"), "reviewed_at") or decision.created_at
    decision.reviewed_by = text_at(data, "reviewed_by") or decision.recorded_by
    decision.actual_result = text_at(data, "actual_result")
    decision.lessons = text_at(data, "lessons")
    decision.review_notes = text_at(data, "review_notes")
    decision.affected_kpis = json_mapping(data.get("affected_kpis"), "affected_kpis")
