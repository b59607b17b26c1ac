"""Every table of the schema, imported in one place so Alembic sees the whole metadata."""

from .base import Base
from .decisions import Decision, DecisionReason, DecisionTag
from .guardrails import GuardrailEvaluation, GuardrailRuleResult
from .outbox import OutboxEvent

__all__ = [
    "Base", "Decision", "DecisionReason", "DecisionTag", "GuardrailEvaluation",
    "GuardrailRuleResult", "OutboxEvent",
]
