"""The announceIntent operation; failures and rate limits are recorded as audit rows too."""

from __future__ import annotations

from app import scopes
from app.errors import CONFLICT, GUARDRAIL_EVAL_FAILED
from app.operations.registry import Operation, Registry

from .failed import record_failure
from .schemas import AnnounceIntentParams, AnnounceIntentResult
from .service import announce


def register(registry: Registry) -> None:
    registry.add(
        Operation(
            "cstp.announceIntent",
            AnnounceIntentParams,
            AnnounceIntentResult,
            announce,
            "Announce what the agent intends to do: similar past decisions and how they turned "
            "out, the guardrails' verdict and suggestions. Stored for audit, however it ends.",
            "Call this BEFORE acting on anything that matters (deploying, changing data, picking "
            "an architecture): describe what you intend to do and why. Answers the most similar "
            "past decisions and how they turned out, whether the organisation's guardrails allow "
            "the action (allowed false means do not proceed), and concrete suggestions. Pass a "
            "correlationId of your own (or keep the one returned) and give it to record_decision "
            "once you have decided.",
            transaction=False,  # app.intents.writer commits its rows in batches
            on_failure=record_failure,
            # no QueryFailed: while the vector index is down it answers from keyword search
            errors=(GUARDRAIL_EVAL_FAILED, CONFLICT),
            not_tool_arguments=("agent",),
            tool="announce_intent",
            scopes=(scopes.ANNOUNCE,),
        )
    )
