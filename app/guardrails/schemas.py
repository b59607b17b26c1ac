"""Wire structs of the guardrail methods."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta

from app.decisions.schemas import NonBlank, ShortText, Stakes, Struct, Unit


class ActionIn(Struct):
    description: NonBlank
    category: ShortText | None = None
    stakes: Stakes | None = None
    confidence: Unit | None = None
    project: ShortText | None = None
    context: dict[str, Any] = {}


class CheckGuardrailsParams(Struct):
    action: ActionIn


class ListGuardrailsParams(Struct):
    scope: Annotated[str, Meta(max_length=256)] | None = None
