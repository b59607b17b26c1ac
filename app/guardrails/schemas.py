"""Wire structs of the guardrail methods."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta

from app.approvals.schemas import ApprovalId, Escalation
from app.wire import FreeForm, NonBlank, ShortText, Stakes, Struct, Unit


class ActionIn(Struct):
    description: NonBlank
    category: ShortText | None = None
    stakes: Stakes | None = None
    confidence: Unit | None = None
    project: ShortText | None = None
    context: FreeForm = {}  # noqa: RUF012 - a msgspec field: each instance gets a copy


class CheckGuardrailsParams(Struct):
    action: ActionIn
    # An approval this agent asked for the same action (SPEC.md, section 8): once approved,
    # the escalation it answers is allowed.
    approval_id: ApprovalId | None = None


class ListGuardrailsParams(Struct):
    scope: Annotated[str, Meta(max_length=256)] | None = None


# omit_defaults: ``suggestion`` is absent when the rule has none (docs/PROTOCOL.md).
class GuardrailHit(Struct, omit_defaults=True):
    """A rule that fired: a violation (``block``) or a warning (``warn``)."""

    guardrail_id: str
    name: str
    message: str
    severity: Literal["block", "warn"]
    suggestion: str | None = None


# announceIntent's ``guardrailStatus``, rendered by app.guardrails.service (Checked.status).
# omit_defaults: ``escalation`` is there only when an escalate rule asked for approval.
class GuardrailStatus(Struct, omit_defaults=True):
    allowed: bool
    violations: list[GuardrailHit]
    warnings: list[GuardrailHit]
    evaluated: int
    evaluation_id: str
    escalation: Escalation | None = None


# omit_defaults: ``escalation`` is there only when an escalate rule asked for approval.
class CheckGuardrailsResult(Struct, omit_defaults=True):
    allowed: bool
    violations: list[GuardrailHit]
    warnings: list[GuardrailHit]
    evaluated: int
    evaluated_at: str
    agent: str
    evaluation_id: str
    rule_set_version: str
    escalation: Escalation | None = None


class ConditionOut(Struct):
    field: str
    operator: str
    value: Any
    op: str  # the same as ``operator``; deprecated (docs/PROTOCOL.md)


# omit_defaults: ``suggestion`` is absent when the rule has none.
class GuardrailOut(Struct, omit_defaults=True):
    """``timeout`` is an escalate rule's only (how long its approval waits, e.g. ``1h``)."""

    id: str
    description: str
    action: Literal["block", "warn", "escalate"]
    # "shadow": evaluated and stored, never part of a verdict (docs/GUARDRAILS.md)
    mode: Literal["enforce", "shadow"]
    scope: list[str]
    conditions: list[ConditionOut]
    requirements: list[ConditionOut]
    suggestion: str | None = None
    timeout: str | None = None


class ListGuardrailsResult(Struct):
    guardrails: list[GuardrailOut]
    count: int
    agent: str
    rule_set_version: str
