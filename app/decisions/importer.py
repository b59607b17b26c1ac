"""Load a tree of decision YAML files into the database (``cstp import DIR``).

Accepts the layout of SPEC.md section 3, which other decision journals also write: keys this
server does not know are ignored; a file that cannot be read is reported with the reason and
skipped. Idempotent: a decision whose id is already stored is left alone. Imported decisions
get their YAML export and index entry through the outbox, like any other write.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from sqlalchemy import select

from app.db.decisions import Decision, DecisionReason, DecisionReview, DecisionTag

from .document import summarize

if TYPE_CHECKING:
    from app.services import Services

Progress = Callable[[int, int], None]
BATCH = 200
STAKES = {"low", "medium", "high", "critical"}
OUTCOMES = {"success", "partial", "failure", "abandoned"}
REASON_TYPES = {
    "authority", "analogy", "analysis", "pattern", "intuition", "empirical", "elimination",
    "constraint",
}
MENTAL_STATES = {"deliberate", "reactive", "exploratory", "habitual", "pressured"}
HEX_ID = re.compile(r"^[0-9a-f]{8}$")


class Unreadable(Exception):
    """This file cannot be imported; the message says why (shown to the operator)."""


@dataclass
class ImportReport:
    files: int = 0
    new: int = 0
    existing: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)


def find_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix in {".yaml", ".yml"} and p.is_file())


def _when(value: Any, key: str) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise Unreadable(f"{key}: not an ISO-8601 date or timestamp") from None
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    raise Unreadable(f"{key}: not a date")


def _text(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise Unreadable(f"{key}: must be text")


def _int(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise Unreadable(f"{key}: must be a whole number")
    return value


def _flag(data: dict[str, Any], key: str) -> bool | None:
    value = data.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise Unreadable(f"pre_decision.{key}: must be true or false")


def _choice(value: Any, allowed: set[str], key: str, default: str | None = None) -> str | None:
    if value is None:
        return default
    if not isinstance(value, str) or value not in allowed:
        raise Unreadable(f"{key}: {value!r} is not one of {', '.join(sorted(allowed))}")
    return value


def decision_id(data: dict[str, Any], content: bytes) -> str:
    """The file's own id when it is ours (8 hex), else a stable id derived from it."""
    raw = data.get("id")
    if isinstance(raw, str) and HEX_ID.match(raw):
        return raw
    basis = str(raw).encode() if raw is not None else content
    return hashlib.sha256(b"cstp-import:" + basis).hexdigest()[:8]


def parse_file(path: Path, categories: tuple[str, ...]) -> Decision:
    content = path.read_bytes()
    try:
        data = yaml.safe_load(content)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise Unreadable(f"not valid YAML{where}") from None
    if not isinstance(data, dict):
        raise Unreadable("not a mapping of decision fields")
    text = _text(data, "decision") or _text(data, "summary") or _text(data, "title")
    if not text or not text.strip():
        raise Unreadable("decision: missing")
    confidence = data.get("confidence")
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not (
        0.0 <= float(confidence) <= 1.0
    ):
        raise Unreadable("confidence: must be a number between 0.0 and 1.0")
    category = _choice(data.get("category"), set(categories), "category")
    if category is None:
        raise Unreadable("category: missing")
    created = _when(data.get("date") or data.get("created_at"), "date")
    if created is None:
        raise Unreadable("date: missing")
    decision = Decision(
        id=decision_id(data, content), summary=_text(data, "summary") or summarize(text),
        decision=text.strip(), category=category, confidence=float(confidence),
        stakes=_choice(data.get("stakes"), STAKES, "stakes", "medium"),
        status="pending", created_at=created,
        recorded_by=_text(data, "recorded_by") or "import", context=_text(data, "context"),
        mental_state=_choice(data.get("mental_state"), MENTAL_STATES, "mental_state"),
        review_by=_when(data.get("review_by"), "review_by"),
        kpi_indicators=[str(k) for k in data.get("kpi_indicators") or []] or None,
        project=_text(data, "project"), feature=_text(data, "feature"), pr=_int(data, "pr"),
        file=_text(data, "file"), line=_int(data, "line"), commit=_text(data, "commit"),
    )
    pre = data.get("pre_decision")
    if isinstance(pre, dict):
        decision.pre_query_run = _flag(pre, "query_run")
        decision.pre_similar_found = _int(pre, "similar_found")
        decision.pre_guardrails_checked = _flag(pre, "guardrails_checked")
        decision.pre_guardrails_passed = _flag(pre, "guardrails_passed")
    decision.reasons = [_reason(i, r) for i, r in enumerate(data.get("reasons") or [])]
    tags = [str(t) for t in data.get("tags") or [] if str(t).strip()]
    decision.tags = [DecisionTag(tag=t, position=i) for i, t in enumerate(dict.fromkeys(tags))]
    _apply_review(decision, data)
    return decision


def _reason(position: int, raw: Any) -> DecisionReason:
    if not isinstance(raw, dict) or not isinstance(raw.get("text"), str):
        raise Unreadable(f"reasons[{position}]: needs a text")
    strength = raw.get("strength", 0.8)
    if isinstance(strength, bool) or not isinstance(strength, (int, float)):
        raise Unreadable(f"reasons[{position}].strength: must be a number")
    kind = _choice(raw.get("type", "analysis"), REASON_TYPES, f"reasons[{position}].type")
    return DecisionReason(position=position, type=kind, text=raw["text"], strength=float(strength))


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
    kpis = data.get("affected_kpis")
    decision.affected_kpis = kpis if isinstance(kpis, dict) else None


def _chunks(items: list[Path], size: int) -> Iterator[list[Path]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


async def import_tree(services: Services, root: Path, progress: Progress | None = None) -> ImportReport:
    files = find_files(root)
    report = ImportReport(files=len(files))
    categories = services.settings.categories
    done = 0
    for chunk in _chunks(files, BATCH):
        parsed: list[Decision] = []
        for path in chunk:
            try:
                parsed.append(parse_file(path, categories))
            except Unreadable as exc:
                report.failed.append((str(path.relative_to(root)), str(exc)))
            except OSError as exc:
                report.failed.append((str(path.relative_to(root)), exc.strerror or "unreadable"))
        async with services.db.transaction(write=True) as session:
            ids = [d.id for d in parsed]
            known = set(await session.scalars(select(Decision.id).where(Decision.id.in_(ids))))
            for decision in parsed:
                if decision.id in known:
                    report.existing += 1
                    continue
                known.add(decision.id)
                session.add(decision)
                if decision.outcome is not None:
                    session.add(_history_row(decision))
                # Due at once: this command (or a running server) carries them out.
                services.relay.enqueue(session, decision.id, leased=False)
                report.new += 1
        done += len(chunk)
        if progress is not None:
            progress(done, len(files))
    return report


def _history_row(decision: Decision) -> DecisionReview:
    assert decision.outcome is not None and decision.reviewed_at is not None
    return DecisionReview(
        decision_id=decision.id, outcome=decision.outcome, actual_result=decision.actual_result,
        lessons=decision.lessons, notes=decision.review_notes,
        affected_kpis=decision.affected_kpis, reviewed_by=decision.reviewed_by or "import",
        reviewed_at=decision.reviewed_at,
    )

