"""Every table of the schema, imported in one place so Alembic sees the whole metadata."""

from .base import Base
from .decisions import Decision, DecisionReason, DecisionReview, DecisionTag
from .guardrails import GuardrailEvaluation, GuardrailRuleResult
from .intents import Intent, IntentMatch
from .outbox import OutboxEvent

__all__ = [
    "Base",
    "Decision",
    "DecisionReason",
    "DecisionReview",
    "DecisionTag",
    "GuardrailEvaluation",
    "GuardrailRuleResult",
    "Intent",
    "IntentMatch",
    "OutboxEvent",
]
