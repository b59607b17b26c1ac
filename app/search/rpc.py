"""Registers cstp.queryDecisions."""

from __future__ import annotations

from app.rpc.registry import Method, Registry

from .schemas import QueryDecisionsParams
from .service import query_decisions


def register(registry: Registry) -> None:
    registry.add(
        Method("cstp.queryDecisions", QueryDecisionsParams, query_decisions, writes=False)
    )
