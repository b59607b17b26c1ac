"""One decision YAML file read into an unsaved ``Decision`` (for ``cstp import``).

The layout is docs/PROTOCOL.md's ("Decision files"), which other decision journals also write:
keys this server does not know are ignored, and a file that cannot be read, or whose values no
column could hold, raises ``Unreadable`` with the reason to show the operator.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, get_args

import yaml
from sqlalchemy import ColumnElement, String

from app.db.decisions import Decision, DecisionReason, DecisionTag
from app.errors import CstpError
from app.operations.params import decode, nul_path
from app.wire import Outcome, Stakes

from .document import summarize
from .schemas import (
    MentalState,
    ReasonType,
    RecordDecisionParams,
    ReviewDecisionParams,
)

# The values the wire accepts (app.wire, app.decisions.schemas), as sets.
STAKES = set(get_args(Stakes))
OUTCOMES = set(get_args(Outcome))
REASON_TYPES = set(get_args(ReasonType))
MENTAL_STATES = set(get_args(MentalState))
HEX_ID = re.compile(r"[0-9a-f]{8}")
CORRELATION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1  # what an Integer column holds on Postgres
# The lengths of the decision's text columns, read from the model, by column (= YAML key) name.
LENGTHS: dict[str, int] = {
    c.name: c.type.length
    for c in Decision.__table__.columns
    if isinstance(c.type, String) and c.type.length is not None
}


def _string_length(column: ColumnElement[Any]) -> int:
    assert isinstance(column.type, String) and column.type.length is not None
    return column.type.length


TAG_LENGTH = _string_length(DecisionTag.__table__.c.tag)


# libyaml's safe loader when PyYAML has it (its wheels do): the same documents, faster.
_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class Unreadable(Exception):
    """This file cannot be imported; the message says why (shown to the operator)."""


def _utc(value: datetime, key: str) -> datetime:
    try:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00 is before the first UTC instant
        raise Unreadable(f"{key}: out of range") from None


def _when(value: Any, key: str) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return _utc(value, key)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise Unreadable(f"{key}: not an ISO-8601 date or timestamp") from None
        return _utc(parsed, key)
    raise Unreadable(f"{key}: not a date")


def _checked(value: str, key: str, limit: int | None) -> str:
    """Text as both databases can store it: no NUL character (Postgres refuses it), and no
    longer than its column."""
    if "\x00" in value:
        raise Unreadable(f"{key}: holds a NUL character")
    if limit is not None and len(value) > limit:
        raise Unreadable(f"{key}: longer than {limit} characters")
    return value


def _text(data: dict[str, Any], key: str) -> str | None:
    """Text for the column named ``key`` (numbers are taken as text), within its length."""
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return _checked(str(value), key, LENGTHS.get(key))
    raise Unreadable(f"{key}: must be text")


def _correlation_id(data: dict[str, Any]) -> str | None:
    value = _text(data, "correlation_id")
    if value is not None and not CORRELATION_ID.fullmatch(value):
        raise Unreadable("correlation_id: 1-128 characters of A-Z a-z 0-9 . _ : -")
    return value


def _int(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise Unreadable(f"{key}: must be a whole number")
    if not INT32_MIN <= value <= INT32_MAX:
        raise Unreadable(f"{key}: out of range")
    return value


def _list(data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise Unreadable(f"{key}: must be a list")
    return value


def _scalars(data: dict[str, Any], key: str, limit: int | None = None) -> list[str]:
    """A list of plain values (text, numbers), as text; a lone text is a list of one."""
    if isinstance(data.get(key), str):
        return [_checked(data[key], key, limit)]
    out = []
    for i, item in enumerate(_list(data, key)):
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise Unreadable(f"{key}[{i}]: must be text")
        out.append(_checked(str(item), f"{key}[{i}]", limit))
    return out


def _json_mapping(value: Any, key: str) -> dict[str, Any] | None:
    """A mapping as a JSON column stores it: YAML dates and times become ISO text."""
    if not isinstance(value, dict):
        return None
    try:
        encoded = json.dumps(value, default=str, allow_nan=False)
    except (TypeError, ValueError):
        raise Unreadable(f"{key}: cannot be stored (not finite numbers or text)") from None
    result: dict[str, Any] = json.loads(encoded)
    where = nul_path({key: result})
    if where is not None:
        raise Unreadable(f"{where}: holds a NUL character")
    return result


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
    if isinstance(raw, str) and HEX_ID.fullmatch(raw):
        return raw
    basis = str(raw).encode() if raw is not None else content
    return hashlib.sha256(b"cstp-import:" + basis).hexdigest()[:8]


def read_capped(path: Path, max_bytes: int) -> bytes:
    """The file's bytes, if it is a regular file (a symbolic link is not followed) of at most
    ``max_bytes`` (the API's body cap: a file holds no more than a request could)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link
            raise Unreadable("a symbolic link: not followed") from None
        raise
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise Unreadable("not a regular file")
        content = handle.read(max_bytes + 1)
    if len(content) > max_bytes:
        raise Unreadable(f"larger than {max_bytes} bytes (CSTP_MAX_BODY_BYTES)")
    return content


def _refuse_aliases(content: bytes) -> None:
    """Refuse YAML aliases (``*name``): each one repeats a whole node, so a kilobyte of nested
    aliases ("billion laughs") expands to gigabytes. Our own export never writes one."""
    try:
        for event in yaml.parse(content, Loader=_Loader):
            if isinstance(event, yaml.AliasEvent):
                mark = event.start_mark  # the parser always sets it
                line = f" (line {mark.line + 1})" if mark is not None else ""
                raise Unreadable(f"YAML aliases are not accepted{line}")
    except yaml.YAMLError:
        return  # safe_load reports the syntax error, with its line


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


def _within_api_limits(d: Decision) -> None:
    """Every field within the limits the API holds a client to (lengths, counts, the
    free-form limits of ``affected_kpis``): checked by the API's own params structs, so an
    import can store nothing a client could not have sent."""
    recorded = {
        "decision": d.decision,
        "confidence": d.confidence,
        "category": d.category,
        "stakes": d.stakes,
        "context": d.context,
        "mentalState": d.mental_state,
        "reasons": [{"type": r.type, "text": r.text, "strength": r.strength} for r in d.reasons],
        "kpiIndicators": d.kpi_indicators or [],
        "tags": [t.tag for t in d.tags],
        "project": d.project,
        "feature": d.feature,
        "pr": d.pr,
        "file": d.file,
        "line": d.line,
        "commit": d.commit,
        "correlationId": d.correlation_id,
    }
    checks: list[tuple[dict[str, Any], type[Any]]] = [(recorded, RecordDecisionParams)]
    if d.outcome is not None:
        checks.append(
            (
                {
                    "id": d.id,
                    "outcome": d.outcome,
                    "actualResult": d.actual_result,
                    "lessons": d.lessons,
                    "notes": d.review_notes,
                    "affectedKpis": d.affected_kpis,
                },
                ReviewDecisionParams,
            )
        )
    for params, struct in checks:
        try:
            decode(params, struct)
        except CstpError as exc:
            field, problem = exc.data["field"], exc.data["error"]
            raise Unreadable(f"{_yaml_key(field)}: {problem}") from None


def _yaml_key(field: str) -> str:
    """The file's spelling of an API field path: ``kpiIndicators[2]`` -> ``kpi_indicators[2]``
    (``notes`` is ``review_notes`` in the file)."""
    head, dot, rest = field.partition(".")
    name = re.sub(r"(?<=[a-z])([A-Z])", lambda m: "_" + m.group(1).lower(), head)
    return ("review_notes" if name == "notes" else name) + dot + rest


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
