"""The approval operations: getApproval, listApprovals, decideApproval."""

from __future__ import annotations

from app import scopes
from app.errors import CONFLICT, DECISION_NOT_FOUND
from app.operations.registry import Operation, Registry

from . import service
from .schemas import (
    ApprovalResult,
    DecideApprovalParams,
    GetApprovalParams,
    ListApprovalsParams,
    ListApprovalsResult,
)


def register(registry: Registry) -> None:
    registry.add(
        Operation(
            "cstp.getApproval",
            GetApprovalParams,
            ApprovalResult,
            service.get,
            "An approval and where it stands (pending, approved, denied or expired).",
            "Read an approval that an escalate guardrail asked for: its status (pending, "
            "approved, denied or expired), the action, the rules that asked, its deadline and, "
            "once decided, who decided, when and why. An agent sees its own requests; an "
            "approver or auditor every approval of the workspace.",
            writes=False,
            errors=(DECISION_NOT_FOUND,),
            tool="get_approval",
            scopes=(scopes.READ, scopes.APPROVE, scopes.AUDIT),
        )
    )
    registry.add(
        Operation(
            "cstp.listApprovals",
            ListApprovalsParams,
            ListApprovalsResult,
            service.listing,
            "The workspace's approvals, pending first (soonest to expire first), then the "
            "others, newest first; optionally of one status.",
            "List the approvals of your workspace that escalate guardrails asked for: pending "
            "ones first, soonest to expire first; filter by status (pending, approved, denied, "
            "expired). For approvers and auditors.",
            writes=False,
            tool="list_approvals",
            scopes=(scopes.APPROVE, scopes.AUDIT),
        )
    )
    registry.add(
        Operation(
            "cstp.decideApproval",
            DecideApprovalParams,
            ApprovalResult,
            service.decide,
            "Approve or deny a pending approval, once; never by the agent that asked for it.",
            "Approve or deny a pending approval (verdict approve or deny, with a reason). The "
            "agent that asked can never decide its own request, and a decided or expired "
            "approval cannot be decided again. The requesting agent then re-announces its "
            "intent with the same correlationId and is allowed (approved) or not.",
            errors=(DECISION_NOT_FOUND, CONFLICT),
            tool="decide_approval",
            scopes=(scopes.APPROVE,),
        )
    )
