"""Search filters for ``cstp.queryDecisions`` and their translation into Chroma ``where`` clauses.

The spec promises that *every* filter is applied, in any combination, and that results always
satisfy all of them. So the filters are pushed down into Chroma (``to_where``) instead of being
applied after a top-k search (which would silently lose matches), and the same semantics exist
in pure Python (``matches``) so that callers can double-check results and tests have a reference.

Stored metadata keys (written by the decision metadata builder): ``category``, ``stakes``,
``status``, ``agent``, ``project``, ``feature``, ``outcome``, ``title``, ``date`` (str);
``confidence``, ``created_at`` (float — store them as ``float(x)`` even when the value is
whole: Chroma 1.5.9 truncates a float bound when it compares it with an *int* stored value, so
an int ``0`` would match ``confidence >= 0.5``); ``pr`` (int); ``has_outcome`` (bool);
``superseded`` (bool: ``true``, only a superseded decision has the key); ``tags`` (non-empty
list of str, see ``tag_metadata``). Absent optional keys are simply not stored (Chroma rejects
None and empty lists).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, TypeGuard

TAGS_KEY = "tags"
SUPERSEDED_KEY = "superseded"


@dataclass(frozen=True)
class SearchFilters:
    """Filters of a semantic search; a decision must satisfy all the ones that are set.

    Semantics (identical in ``to_where`` and ``matches``):

    - ``category``, ``agent``, ``project``, ``feature``, ``pr``, ``has_outcome``: equality.
      A decision that lacks the key (e.g. no ``project``) never matches a filter on it.
    - ``stakes``, ``status``: the decision's value is any of the listed values.
    - ``min_confidence`` / ``max_confidence``: inclusive bounds (0.0 and 1.0 are real values).
    - ``date_after``: inclusive (``created_at >= ts``); ``date_before``: exclusive
      (``created_at < ts``), so consecutive windows never overlap. Naive datetimes are UTC.
    - ``tags``: the decision has EVERY listed tag (exact, case-sensitive).
    - ``None`` means "not filtered"; so does an empty tuple (an empty list in a request is
      read as "no restriction", not as "match nothing").
    - Superseded decisions (``superseded: true`` in the entry; the key is absent otherwise)
      are left out unless ``include_superseded``; that is a default, not a filter the caller
      chose, so ``is_empty`` leaves it out.

    ``workspace`` is not a filter a caller chooses: it is the calling token's, and every search
    is made inside it (its own vector collection, a condition of every SQL statement), so it
    is never "unfiltered" and ``is_empty`` leaves it out.
    """

    workspace: str = field(kw_only=True)

    category: str | None = None
    stakes: tuple[str, ...] | None = None
    status: tuple[str, ...] | None = None
    min_confidence: float | None = None
    max_confidence: float | None = None
    date_after: datetime | None = None
    date_before: datetime | None = None
    agent: str | None = None
    tags: tuple[str, ...] | None = None
    project: str | None = None
    feature: str | None = None
    pr: int | None = None
    has_outcome: bool | None = None
    include_superseded: bool = False

    def is_empty(self) -> bool:
        """True when no filter is set (an empty tuple counts as unset). Leaving superseded
        decisions out is not counted: few decisions are superseded, so a search probes as
        an unfiltered one does, and looks further only when the probe held too few."""
        return all(
            getattr(self, f.name) in (None, ())
            for f in fields(self)
            if f.name not in ("workspace", "include_superseded")
        )


def tag_metadata(tags: Sequence[str] | None) -> dict[str, Any]:
    """The metadata entries that represent ``tags`` in the index.

    Chroma 1.5.9 supports array metadata and ``$contains`` on it (verified), so tags are one
    ``tags`` key holding a de-duplicated list in first-seen order. No tags gives ``{}``: Chroma
    rejects empty lists, and an absent key is what "no tags" means to ``to_where``.
    """
    if not tags:
        return {}
    seen: dict[str, None] = {}
    for tag in tags:
        if isinstance(tag, str) and tag:
            seen.setdefault(tag, None)
    return {TAGS_KEY: list(seen)} if seen else {}


def _timestamp(value: datetime) -> float:
    """Epoch seconds of ``value``; a naive datetime is taken as UTC (what we store)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def _any_of(key: str, values: tuple[str, ...]) -> dict[str, Any]:
    unique = list(dict.fromkeys(values))
    if len(unique) == 1:
        return {key: {"$eq": unique[0]}}
    return {key: {"$in": unique}}


def _clauses(f: SearchFilters) -> list[dict[str, Any]]:
    """One Chroma clause per set filter, in a fixed order (deterministic ``where``)."""
    clauses: list[dict[str, Any]] = []
    if f.category is not None:
        clauses.append({"category": {"$eq": f.category}})
    if f.stakes:
        clauses.append(_any_of("stakes", f.stakes))
    if f.status:
        clauses.append(_any_of("status", f.status))
    if f.min_confidence is not None:
        clauses.append({"confidence": {"$gte": float(f.min_confidence)}})
    if f.max_confidence is not None:
        clauses.append({"confidence": {"$lte": float(f.max_confidence)}})
    if f.date_after is not None:
        clauses.append({"created_at": {"$gte": _timestamp(f.date_after)}})
    if f.date_before is not None:
        clauses.append({"created_at": {"$lt": _timestamp(f.date_before)}})
    if f.agent is not None:
        clauses.append({"agent": {"$eq": f.agent}})
    for tag in dict.fromkeys(f.tags or ()):
        clauses.append({TAGS_KEY: {"$contains": tag}})
    if f.project is not None:
        clauses.append({"project": {"$eq": f.project}})
    if f.feature is not None:
        clauses.append({"feature": {"$eq": f.feature}})
    if f.pr is not None:
        clauses.append({"pr": {"$eq": int(f.pr)}})
    if f.has_outcome is not None:
        clauses.append({"has_outcome": {"$eq": bool(f.has_outcome)}})
    if not f.include_superseded:  # $ne matches an entry without the key (verified, 1.5.9)
        clauses.append({SUPERSEDED_KEY: {"$ne": True}})
    return clauses


def to_where(f: SearchFilters) -> dict[str, Any] | None:
    """The Chroma ``where`` clause for ``f``, or None when nothing is filtered.

    A single clause is returned as-is; several are wrapped in ``$and`` because Chroma rejects
    several top-level keys and an ``$and`` of fewer than two expressions.
    """
    clauses = _clauses(f)
    if not clauses:
        return None
    if len(clauses) == 1:
        return clauses[0]
    return {"$and": clauses}


def _is_number(value: object) -> TypeGuard[float]:
    """An int or a float that is not NaN (a bool is not a number here)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and not (isinstance(value, float) and math.isnan(value))
    )


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _str_equals(metadata: Mapping[str, Any], key: str, expected: str) -> bool:
    value = metadata.get(key)
    return isinstance(value, str) and value == expected


def matches(f: SearchFilters, metadata: Mapping[str, Any]) -> bool:
    """Whether a decision with ``metadata`` satisfies ``f`` — ``to_where`` in pure Python.

    Types are compared strictly, like Chroma does: a bool is not a number, a missing key
    matches no filter on that key.
    """
    if f.category is not None and not _str_equals(metadata, "category", f.category):
        return False
    for key, allowed in (("stakes", f.stakes), ("status", f.status)):
        if allowed:
            value = metadata.get(key)
            if not isinstance(value, str) or value not in allowed:
                return False
    confidence = metadata.get("confidence")
    if f.min_confidence is not None or f.max_confidence is not None:
        if not _is_number(confidence):
            return False
        if f.min_confidence is not None and not confidence >= float(f.min_confidence):
            return False
        if f.max_confidence is not None and not confidence <= float(f.max_confidence):
            return False
    created_at = metadata.get("created_at")
    if f.date_after is not None or f.date_before is not None:
        if not _is_number(created_at):
            return False
        if f.date_after is not None and not created_at >= _timestamp(f.date_after):
            return False
        if f.date_before is not None and not created_at < _timestamp(f.date_before):
            return False
    if f.agent is not None and not _str_equals(metadata, "agent", f.agent):
        return False
    if f.tags:
        stored = metadata.get(TAGS_KEY)
        if not isinstance(stored, (list, tuple)) or not all(t in stored for t in f.tags):
            return False
    if f.project is not None and not _str_equals(metadata, "project", f.project):
        return False
    if f.feature is not None and not _str_equals(metadata, "feature", f.feature):
        return False
    if f.pr is not None:
        pr = metadata.get("pr")
        if not _is_int(pr) or pr != int(f.pr):
            return False
    if f.has_outcome is not None:
        has_outcome = metadata.get("has_outcome")
        if not isinstance(has_outcome, bool) or has_outcome is not bool(f.has_outcome):
            return False
    return f.include_superseded or metadata.get(SUPERSEDED_KEY) is not True
