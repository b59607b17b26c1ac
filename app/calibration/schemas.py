"""Wire structs of cstp.getCalibration: strict at the edge, camelCase on the wire.

SPEC section 2 lets older clients send the filters at the top level of params instead of
inside ``filters``; both spellings are declared here so each is validated with its own field
path (``filters.minDecisions`` or ``minDecisions``) in the -32602 it may earn.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta

from app.decisions.schemas import ShortText, Stakes, Struct

GroupBy = Literal["category", "stakes", "agent", "confidenceBucket"]
MinDecisions = Annotated[int, Meta(ge=1, le=1_000_000_000)]
Moment = Annotated[str, Meta(max_length=64)]

DEFAULT_MIN_DECISIONS = 5


class CalibrationFilters(Struct):
    """Which decisions are scored; every filter given is applied, in any combination."""

    agent: ShortText | None = None
    category: ShortText | None = None
    stakes: Stakes | None = None
    since: Moment | None = None
    until: Moment | None = None
    min_decisions: MinDecisions | None = None


class GetCalibrationParams(Struct):
    filters: CalibrationFilters | None = None
    group_by: GroupBy | None = None
    # Top-level aliases of the filters (used when ``filters`` does not give the key).
    # ``agent`` may also arrive as the informational ``{"id": ...}`` object older clients
    # send about themselves; that form is never a filter and is ignored.
    agent: ShortText | dict[str, Any] | None = None
    category: ShortText | None = None
    stakes: Stakes | None = None
    since: Moment | None = None
    until: Moment | None = None
    min_decisions: MinDecisions | None = None
