"""Wire structs of the approval methods and of an escalation as the guardrail answers show
it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta

from app.wire import Count, LongText, Struct

ApprovalStatus = Literal["pending", "approved", "denied", "expired"]
ApprovalId = Annotated[str, Meta(pattern=r"\A[0-9a-f-]{1,36}\Z", max_length=36)]


class Escalation(Struct):
    """``escalation`` of checkGuardrails' result and announceIntent's ``guardrailStatus``: the
    approval an escalate rule asked for, where it stands, and which rules asked."""

    approval_id: str
    status: ApprovalStatus
    expires_at: str
    rules: list[str]


# omit_defaults: decidedAt, decidedBy and reason are absent while nobody has decided.
class ApprovalOut(Struct, omit_defaults=True):
    id: str
    status: ApprovalStatus
    requested_by: str
    correlation_id: str | None
    action: dict[str, Any]
    rules: list[str]
    created_at: str
    expires_at: str
    evaluation_id: str
    decided_at: str | None = None
    decided_by: str | None = None
    reason: str | None = None


class GetApprovalParams(Struct):
    id: ApprovalId


class ApprovalResult(Struct):
    """getApproval's and decideApproval's answer."""

    approval: ApprovalOut


class ListApprovalsParams(Struct):
    status: ApprovalStatus | None = None
    limit: Annotated[int, Meta(ge=1, le=500)] = 20
    offset: Count = 0


class ListApprovalsResult(Struct):
    approvals: list[ApprovalOut]
    total: int


class DecideApprovalParams(Struct):
    id: ApprovalId
    verdict: Literal["approve", "deny"]
    reason: LongText | None = None
