"""Wire types that several contexts share: ids, enumerations, bounded text and numbers, the
base params struct and the result shapes more than one method answers with. Every context's
schemas module imports them from here (never from another context's schemas)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

NonBlank = Annotated[str, Meta(pattern=r"\S", max_length=20_000)]
ShortText = Annotated[str, Meta(pattern=r"\S", max_length=256)]
Unit = Annotated[float, Meta(ge=0.0, le=1.0)]
Tag = Annotated[str, Meta(pattern=r"\S", max_length=128)]
# Whole-string patterns are anchored with \A and \Z: msgspec searches a pattern, and "$"
# also matches before a final newline ("b8fe0ca9\n" would pass).
DecisionId = Annotated[str, Meta(pattern=r"\A[0-9a-f]{8}\Z")]
# Whole numbers that every database column holds (32-bit integer columns).
Count = Annotated[int, Meta(ge=0, le=2_147_483_647)]
CorrelationId = Annotated[str, Meta(pattern=r"\A[A-Za-z0-9._:-]{1,128}\Z")]
Stakes = Literal["low", "medium", "high", "critical"]
Status = Literal["pending", "reviewed"]
Outcome = Literal["success", "partial", "failure", "abandoned"]


class Struct(msgspec.Struct, rename="camel", kw_only=True):
    """Base of every params struct: camelCase names, unknown fields ignored."""


# --- result shapes shared by several methods (getDecision, listDecisions, queryDecisions) ---


class ReasonOut(Struct):
    type: str
    text: str
    strength: float


class DecisionItem(Struct):
    """A decision in a list: listDecisions items; queryDecisions items extend it."""

    id: str
    title: str
    category: str
    confidence: float
    stakes: Stakes
    status: Status
    date: str
    agent: str
    tags: list[str]
    outcome: Outcome | None = None
    project: str | None = None
