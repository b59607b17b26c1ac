"""Registers cstp.queryDecisions."""

from __future__ import annotations

from app.rpc.errors import QUERY_FAILED
from app.rpc.registry import Method, Registry

from .schemas import QueryDecisionsParams, QueryDecisionsResult
from .service import query_decisions


def register(registry: Registry) -> None:
    registry.add(Method(
        "cstp.queryDecisions", QueryDecisionsParams, QueryDecisionsResult, query_decisions,
        "Past decisions nearest in meaning to a query, every filter applied.",
        writes=False, errors=(QUERY_FAILED,),
    ))
