"""The decision operations: record, review, get, list."""

from __future__ import annotations

from app import scopes
from app.errors import DECISION_NOT_FOUND
from app.operations.registry import Operation, Registry

from . import reviews, service
from .schemas import (
    GetDecisionParams,
    GetDecisionResult,
    ListDecisionsParams,
    ListDecisionsResult,
    RecordDecisionParams,
    RecordDecisionResult,
    ReviewDecisionParams,
    ReviewDecisionResult,
)


def register(registry: Registry) -> None:
    registry.add(
        Operation(
            "cstp.recordDecision",
            RecordDecisionParams,
            RecordDecisionResult,
            service.record,
            "Record a decision with its confidence, reasons and context; it is findable at once.",
            "Record a decision you have made, with your confidence (0-1), category, stakes, "
            "reasons and context, so that later agents can learn from it and your calibration "
            "can be measured. Call it after deciding, ideally with the correlationId of the "
            "announce_intent call that preceded it. Answers the decision's id (keep it to review "
            "the decision later) and whether it is already searchable.",
            transaction=False,  # app.decisions.writer commits its rows in batches
            errors=(DECISION_NOT_FOUND,),  # a decision it supersedes is unknown
            tool="record_decision",
            scopes=(scopes.RECORD,),
        )
    )
    registry.add(
        Operation(
            "cstp.reviewDecision",
            ReviewDecisionParams,
            ReviewDecisionResult,
            reviews.review,
            "Record the outcome of a decision (every review is kept; the decision shows the "
            "latest).",
            "Record how a past decision turned out: outcome success, partial, failure or "
            "abandoned, with what actually happened and the lessons learned. Call it once the "
            "result of a recorded decision is known; reviewed decisions are what makes future "
            "suggestions and calibration useful.",
            errors=(DECISION_NOT_FOUND,),
            tool="review_decision",
            scopes=(scopes.REVIEW_OWN, scopes.REVIEW_ANY),
        )
    )
    registry.add(
        Operation(
            "cstp.getDecision",
            GetDecisionParams,
            GetDecisionResult,
            service.get,
            "One decision with every stored field and its reviews.",
            "Fetch one decision by its 8-character id, with every stored field and its review "
            "history. Use it to read the details of a decision that a search or list returned.",
            writes=False,
            errors=(DECISION_NOT_FOUND,),
            tool="get_decision",
            scopes=(scopes.READ,),
        )
    )
    registry.add(
        Operation(
            "cstp.listDecisions",
            ListDecisionsParams,
            ListDecisionsResult,
            service.list_decisions,
            "Page through decisions straight from SQL, filtered and sorted.",
            "List decisions by exact filters (category, stakes, status, agent, tags, dates, "
            "correlationId, a text substring), sorted and paged. Use it to browse or audit; to "
            "find decisions similar in meaning to a situation, use query_decisions instead.",
            writes=False,
            tool="list_decisions",
            scopes=(scopes.READ,),
        )
    )
