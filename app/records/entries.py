"""A decision as the vector index and a list of results show it, built from its row (a whole
``Decision`` or a search's ``Brief``): the index entry that record, review, import, the outbox
relay and ``cstp reindex`` all upsert, and the short form every list of decisions answers.
The YAML export and the full wire shape are app.decisions.document's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from app.db.base import DEFAULT_WORKSPACE
from app.db.decisions import Decision
from app.runtime import iso
from app.wire import DecisionItem, Outcome, ReasonOut, Stakes, Status

from .filters import tag_metadata
from .repository import Brief

MetadataValue = str | int | float | bool | list[str]
Item = TypeVar("Item", bound=DecisionItem)


@dataclass(frozen=True)
class IndexEntry:
    """One document to index: ``document`` is the text that is embedded (Chroma stores only
    the vector and the metadata); ``metadata`` values that are None or empty lists mean
    "absent"."""

    id: str
    document: str
    metadata: Mapping[str, MetadataValue | None]
    workspace: str = DEFAULT_WORKSPACE  # the decision's: its entry goes to that one's collection


def tags_of(decision: Decision | Brief) -> list[str]:
    return list(decision.tag_names)


def reasons_of(decision: Decision | Brief) -> list[dict[str, Any]]:
    """The reasons as the YAML export writes them."""
    return [{"type": r.type, "text": r.text, "strength": r.strength} for r in decision.reasons]


def reasons_out(decision: Decision | Brief) -> list[ReasonOut]:
    """The reasons as getDecision and queryDecisions answer them."""
    return [ReasonOut(type=r.type, text=r.text, strength=r.strength) for r in decision.reasons]


def index_text(d: Decision) -> str:
    """The text that is embedded: the decision and its context. Its reasons (and tags) are
    searched by the keyword index only: embedded with them, paraphrases of a decision found
    it less often (docs/QUALITY.md)."""
    parts = [d.decision]
    if d.context:
        parts.append(d.context)
    return "\n".join(parts)


def index_entry(d: Decision) -> IndexEntry:
    """The vector index document and metadata."""
    return IndexEntry(
        id=d.id, document=index_text(d), metadata=index_metadata(d), workspace=d.workspace
    )


def index_metadata(d: Decision | Brief) -> dict[str, Any]:
    """The filterable metadata of the index entry; app.records.filters reads these keys."""
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
        # only once superseded (absent before: no entry indexed earlier needs rewriting)
        "superseded": True if d.superseded_by is not None else None,
    }
    metadata.update(tag_metadata(tags_of(d)))
    return {k: v for k, v in metadata.items() if v is not None}


def list_item(d: Decision | Brief, kind: type[Item], **extra: Any) -> Item:
    """The short form of a decision in a list, as ``kind`` (a DecisionItem: listDecisions' and
    queryDecisions' add their own fields, given in ``extra``). The row's enumerations hold
    only the values its params allowed (cast, not checked again)."""
    return kind(
        id=d.id,
        title=d.summary,
        category=d.category,
        confidence=d.confidence,
        stakes=cast(Stakes, d.stakes),
        status=cast(Status, d.status),
        date=iso(d.created_at),
        agent=d.recorded_by,
        tags=tags_of(d),
        outcome=cast(Outcome | None, d.outcome),
        project=d.project,
        superseded_by=d.superseded_by,
        **extra,
    )
