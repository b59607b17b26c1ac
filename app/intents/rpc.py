"""Registers cstp.announceIntent; failures and rate limits are recorded as audit rows too."""

from __future__ import annotations

from app.rpc.registry import Method, Registry

from .schemas import AnnounceIntentParams
from .service import announce, record_failure


def register(registry: Registry) -> None:
    registry.add(
        Method("cstp.announceIntent", AnnounceIntentParams, announce, on_failure=record_failure)
    )
