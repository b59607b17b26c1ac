"""Registers the decision methods."""

from __future__ import annotations

from app.rpc.errors import DECISION_NOT_FOUND
from app.rpc.registry import Method, Registry

from . import reviews, service
from .schemas import (
    GetDecisionParams, GetDecisionResult, ListDecisionsParams, ListDecisionsResult,
    RecordDecisionParams, RecordDecisionResult, ReviewDecisionParams, ReviewDecisionResult,
)


def register(registry: Registry) -> None:
    # The call's own session only reads (the announced intent); the rows are committed by the
    # group writer in transactions of its own.
    registry.add(Method(
        "cstp.recordDecision", RecordDecisionParams, RecordDecisionResult, service.record,
        "Record a decision with its confidence, reasons and context; it is findable at once.",
        writes=False,
    ))
    registry.add(Method(
        "cstp.reviewDecision", ReviewDecisionParams, ReviewDecisionResult, reviews.review,
        "Record the outcome of a decision (every review is kept; the decision shows the "
        "latest).",
        errors=(DECISION_NOT_FOUND,),
    ))
    registry.add(Method(
        "cstp.getDecision", GetDecisionParams, GetDecisionResult, service.get,
        "One decision with every stored field and its reviews.",
        writes=False, errors=(DECISION_NOT_FOUND,),
    ))
    registry.add(Method(
        "cstp.listDecisions", ListDecisionsParams, ListDecisionsResult,
        service.list_decisions,
        "Page through decisions straight from SQL, filtered and sorted.", writes=False,
    ))
