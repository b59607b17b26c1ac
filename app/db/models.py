"""Every table of the schema, imported in one place so Alembic sees the whole metadata."""

from .approvals import Approval, ApprovalDecision
from .audit import AuditEntry
from .base import Base
from .briefs import SessionBrief
from .ci import CiDelivery, CiSecret
from .console import ConsoleSession
from .decisions import (
    Decision,
    DecisionReason,
    DecisionReview,
    DecisionSupersede,
    DecisionTag,
    WorkspaceDecisions,
)
from .guardrails import GuardrailEvaluation, GuardrailRuleResult, GuardrailRuleSet
from .intents import Intent, IntentMatch
from .outbox import OutboxEvent
from .tokens import ApiToken, ApiTokenGrant
from .webhooks import WebhookDelivery, WebhookSubscription

__all__ = [
    "ApiToken",
    "ApiTokenGrant",
    "Approval",
    "ApprovalDecision",
    "AuditEntry",
    "Base",
    "CiDelivery",
    "CiSecret",
    "ConsoleSession",
    "Decision",
    "DecisionReason",
    "DecisionReview",
    "DecisionSupersede",
    "DecisionTag",
    "GuardrailEvaluation",
    "GuardrailRuleResult",
    "GuardrailRuleSet",
    "Intent",
    "IntentMatch",
    "OutboxEvent",
    "SessionBrief",
    "WebhookDelivery",
    "WebhookSubscription",
    "WorkspaceDecisions",
]
