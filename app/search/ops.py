"""The search operation: queryDecisions."""

from __future__ import annotations

from app import scopes
from app.errors import QUERY_FAILED
from app.operations.registry import Operation, Registry

from .schemas import QueryDecisionsParams, QueryDecisionsResult
from .service import query_decisions


def register(registry: Registry) -> None:
    registry.add(
        Operation(
            "cstp.queryDecisions",
            QueryDecisionsParams,
            QueryDecisionsResult,
            query_decisions,
            "Past decisions that best match a query, by meaning and by words, every filter "
            "applied.",
            "Search past decisions: describe a situation or question and get the most similar "
            "recorded decisions, with their outcomes when reviewed. By default both by meaning "
            "and by the exact words, so ticket ids, error codes, file names and versions find "
            "the decisions that mention them (retrievalMode semantic or keyword for one side "
            "only). Filters (category, stakes, status, confidence, dates, agent, tags, project) "
            "narrow the results. Use it to learn from precedent before deciding.",
            writes=False,
            errors=(QUERY_FAILED,),
            tool="query_decisions",
            scopes=(scopes.READ,),
        )
    )
