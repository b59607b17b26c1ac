"""Registers the decision methods."""

from __future__ import annotations

from app.rpc.registry import Method, Registry

from . import reviews, service
from .schemas import (
    GetDecisionParams, ListDecisionsParams, RecordDecisionParams, ReviewDecisionParams,
)


def register(registry: Registry) -> None:
    # The call's own session only reads (the announced intent); the rows are committed by the
    # group writer in transactions of its own.
    registry.add(
        Method("cstp.recordDecision", RecordDecisionParams, service.record, writes=False)
    )
    registry.add(Method("cstp.reviewDecision", ReviewDecisionParams, reviews.review))
    registry.add(Method("cstp.getDecision", GetDecisionParams, service.get, writes=False))
    registry.add(
        Method("cstp.listDecisions", ListDecisionsParams, service.list_decisions, writes=False)
    )
