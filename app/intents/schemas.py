"""Wire structs of cstp.announceIntent (seed F004)."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta

from app.decisions.schemas import CorrelationId, NonBlank, ShortText, Stakes, Struct, Unit


class AgentIn(Struct):
    """Informational only: the calling agent is always the one its token maps to."""

    id: Annotated[str, Meta(max_length=256)] | None = None
    url: Annotated[str, Meta(max_length=2048)] | None = None


class AnnounceIntentParams(Struct):
    intent: NonBlank
    context: Annotated[str, Meta(max_length=20_000)] | None = None
    category: ShortText | None = None
    stakes: Stakes = "medium"
    confidence: Unit | None = None
    agent: AgentIn | None = None
    correlation_id: CorrelationId | None = None
    metadata: dict[str, Any] = {}
    project: ShortText | None = None
