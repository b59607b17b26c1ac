"""Wire types that several contexts share: ids, enumerations, bounded text and numbers, the
base params struct and the result shapes more than one method answers with. Every context's
schemas module imports them from here (never from another context's schemas).

Every param has a limit (docs/PROTOCOL.md, "Limits", lists each one, and a test holds every
params schema to it): a text by its length, a list by its count, a number by its range, and a
free-form object by the limits of app.operations.params (its keys are counted here too, so the
JSON Schema of rpc.discover shows ``maxProperties``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from app.operations.params import (
    FREE_FORM_MAX_BYTES,
    FREE_FORM_MAX_DEPTH,
    FREE_FORM_MAX_KEY_LENGTH,
    FREE_FORM_MAX_KEYS,
)

TEXT_MAX = 20_000  # a decision, an intent, a context, a reason, a review's texts
SHORT_MAX = 256  # a category, a project, an agent's name, a KPI

NonBlank = Annotated[str, Meta(pattern=r"\S", max_length=TEXT_MAX)]
LongText = Annotated[str, Meta(max_length=TEXT_MAX)]
ShortText = Annotated[str, Meta(pattern=r"\S", max_length=SHORT_MAX)]
Unit = Annotated[float, Meta(ge=0.0, le=1.0)]
Tag = Annotated[str, Meta(pattern=r"\S", max_length=128)]
# An ISO-8601 date or timestamp as sent; the service parses it (app.operations.params).
Moment = Annotated[str, Meta(max_length=64)]
# Whole-string patterns are anchored with \A and \Z: msgspec searches a pattern, and "$"
# also matches before a final newline ("b8fe0ca9\n" would pass). Their lengths are declared
# as well, so the schema states them as every other text's.
DecisionId = Annotated[str, Meta(pattern=r"\A[0-9a-f]{8}\Z", max_length=8)]
# Whole numbers that every database column holds (32-bit integer columns).
Count = Annotated[int, Meta(ge=0, le=2_147_483_647)]
CorrelationId = Annotated[str, Meta(pattern=r"\A[A-Za-z0-9._:-]{1,128}\Z", max_length=128)]
# A free-form object: any JSON, within the limits that app.operations.params checks first.
FreeForm = Annotated[
    dict[str, Any],
    Meta(
        max_length=FREE_FORM_MAX_KEYS,
        description=(
            f"Any JSON object: at most {FREE_FORM_MAX_DEPTH} levels of nesting, "
            f"{FREE_FORM_MAX_KEYS} keys in all (every level counted), keys of at most "
            f"{FREE_FORM_MAX_KEY_LENGTH} characters, {FREE_FORM_MAX_BYTES // 1024} KiB as JSON."
        ),
    ),
]
Stakes = Literal["low", "medium", "high", "critical"]
Status = Literal["pending", "reviewed"]
Outcome = Literal["success", "partial", "failure", "abandoned"]
# Where a review's outcome comes from: the agent's claim, a person's, or observed by CI.
ReviewSource = Literal["agent", "human", "ci"]


class Struct(msgspec.Struct, rename="camel", kw_only=True):
    """Base of every params struct: camelCase names, unknown fields ignored."""


class AgentIn(Struct):
    """An agent named in params: informational only, the calling agent is always the one
    its token maps to."""

    id: Annotated[str, Meta(max_length=SHORT_MAX)] | None = None
    url: Annotated[str, Meta(max_length=2048)] | None = None


# --- result shapes shared by several methods (getDecision, listDecisions, queryDecisions) ---


class ReasonOut(Struct):
    type: str
    text: str
    strength: float


# omit_defaults: a field with a default (``outcome``, ``project``, and those the extensions
# add) is absent while it has that value.
class DecisionItem(Struct, omit_defaults=True):
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
    # Only a superseded decision has it (listed when ``includeSuperseded`` asks for those).
    superseded_by: str | None = None
