"""Registers cstp.announceIntent; failures and rate limits are recorded as audit rows too."""

from __future__ import annotations

from app.rpc.errors import CONFLICT, GUARDRAIL_EVAL_FAILED, QUERY_FAILED
from app.rpc.registry import Method, Registry

from .schemas import AnnounceIntentParams, AnnounceIntentResult
from .service import announce, record_failure


def register(registry: Registry) -> None:
    registry.add(Method(
        "cstp.announceIntent", AnnounceIntentParams, AnnounceIntentResult, announce,
        "Announce what the agent intends to do: similar past decisions and how they turned "
        "out, the guardrails' verdict and suggestions. Stored for audit, however it ends.",
        on_failure=record_failure, errors=(QUERY_FAILED, GUARDRAIL_EVAL_FAILED, CONFLICT),
    ))
