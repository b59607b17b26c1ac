"""``cstp approvals list|show|approve|deny``: the approver's commands, as a client of a running
server (``CSTP_URL``, ``CSTP_TOKEN``): the same calls, scopes and four eyes as any client."""

from __future__ import annotations

from typing import Any

import click

from .options import client_options, compact
from .render import TITLE_WIDTH, clip, echo, echo_table, kv, print_json
from .transport import Caller

STATUSES = ("pending", "approved", "denied", "expired")


@click.group("approvals")
def approvals() -> None:
    """Approvals that escalate guardrails ask for: list, show, approve, deny."""


@approvals.command("list")
@click.option("--status", type=click.Choice(STATUSES), help="Only approvals of this status.")
@click.option("--limit", type=int, default=20, show_default=True)
@click.option("--offset", type=int, default=0, show_default=True)
@client_options
def list_cmd(cstp: Caller, status: str | None, limit: int, offset: int) -> None:
    """The workspace's approvals, pending first (soonest to expire first).

    Calls cstp.listApprovals (scope approve or audit)."""
    params = compact({"status": status, "limit": limit, "offset": offset})
    result = cstp.call("cstp.listApprovals", params)
    if cstp.as_json:
        return print_json(result)
    rows = [
        [
            a["id"],
            a["status"],
            a["requestedBy"],
            a["expiresAt"] if a["status"] == "pending" else a.get("decidedAt") or a["expiresAt"],
            clip(str(a["action"].get("description") or ""), TITLE_WIDTH),
        ]
        for a in result["approvals"]
    ]
    echo_table(["ID", "STATUS", "ASKED BY", "EXPIRES/DECIDED", "ACTION"], rows)
    echo(f"{len(rows)} of {result['total']} approval(s)")


def _show(approval: dict[str, Any]) -> None:
    action = approval.get("action") or {}
    kv(
        [
            ("id", approval["id"]),
            ("status", approval["status"]),
            ("requestedBy", approval["requestedBy"]),
            ("correlationId", approval.get("correlationId")),
            ("action", action.get("description")),
            ("category", action.get("category")),
            ("stakes", action.get("stakes")),
            ("context", action.get("context")),
            ("rules", ", ".join(approval.get("rules") or [])),
            ("createdAt", approval["createdAt"]),
            ("expiresAt", approval["expiresAt"]),
            ("decidedAt", approval.get("decidedAt")),
            ("decidedBy", approval.get("decidedBy")),
            ("reason", approval.get("reason")),
            ("evaluationId", approval.get("evaluationId")),
        ]
    )


@approvals.command("show")
@click.argument("approval_id")
@client_options
def show_cmd(cstp: Caller, approval_id: str) -> None:
    """One approval and where it stands.

    Calls cstp.getApproval."""
    result = cstp.call("cstp.getApproval", {"id": approval_id})
    if cstp.as_json:
        return print_json(result)
    _show(result["approval"])


def _decide(cstp: Caller, approval_id: str, verdict: str, reason: str | None) -> None:
    params = compact({"id": approval_id, "verdict": verdict, "reason": reason})
    result = cstp.call("cstp.decideApproval", params)
    if cstp.as_json:
        return print_json(result)
    _show(result["approval"])


@approvals.command("approve")
@click.argument("approval_id")
@click.option("--reason", help="Why, kept with the decision.")
@client_options
def approve_cmd(cstp: Caller, approval_id: str, reason: str | None) -> None:
    """Approve a pending approval (never your own request).

    Calls cstp.decideApproval (scope approve)."""
    _decide(cstp, approval_id, "approve", reason)


@approvals.command("deny")
@click.argument("approval_id")
@click.option("--reason", help="Why, kept with the decision.")
@client_options
def deny_cmd(cstp: Caller, approval_id: str, reason: str | None) -> None:
    """Deny a pending approval (never your own request).

    Calls cstp.decideApproval (scope approve)."""
    _decide(cstp, approval_id, "deny", reason)
