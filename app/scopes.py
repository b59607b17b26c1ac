"""Roles and scopes (docs/PROTOCOL.md, "Scopes"): what a token may do.

A token has a role, which gives it the role's scopes, or scopes of its own. Every operation
declares the scopes that let a caller run it (``Operation.scopes``, any one of them); the
runner checks them for every face before the call does anything. What a scope allows on a
given object (reviewing a decision this agent did not record) is decided by the service that
reads the object.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

READ = "read"
ANNOUNCE = "announce"
RECORD = "record"
REVIEW_OWN = "review:own"
REVIEW_ANY = "review:any"
APPROVE = "approve"
AUDIT = "audit"
METRICS = "metrics"

SCOPES = (READ, ANNOUNCE, RECORD, REVIEW_OWN, REVIEW_ANY, APPROVE, AUDIT, METRICS)

ROLES: dict[str, frozenset[str]] = {
    "agent": frozenset({READ, ANNOUNCE, RECORD, REVIEW_OWN}),
    "reviewer": frozenset({READ, REVIEW_ANY}),
    "approver": frozenset({READ, APPROVE}),
    "auditor": frozenset({READ, AUDIT}),
    "monitor": frozenset({METRICS}),
}

DEFAULT_WORKSPACE = "default"
DEFAULT_ROLE = "agent"
#: What a workspace id is (SPEC.md, section 7): it names folders and collections as it is.
WORKSPACE_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


YEAR = re.compile(r"[0-9]{4}")


def workspace_problem(value: object) -> str | None:
    """Why ``value`` cannot be a workspace id, or None. Beyond the pattern, four digits are
    refused: ``decisions/<YYYY>/`` is workspace ``default``'s folder of that year, and
    another workspace's files go to ``decisions/<workspace>/`` (SPEC.md, section 3)."""
    if not isinstance(value, str) or WORKSPACE_ID.fullmatch(value) is None:
        return "lower-case letters, digits and '-', a letter or digit first, at most 63 characters"
    if YEAR.fullmatch(value):
        return "four digits name a year's folder of workspace default's decision files"
    return None


def is_workspace_id(value: object) -> bool:
    return workspace_problem(value) is None


@dataclass(frozen=True)
class Principal:
    """Who a call is from: the agent its token names, in the token's workspace, with the
    token's scopes."""

    agent: str
    workspace: str = DEFAULT_WORKSPACE
    role: str = DEFAULT_ROLE
    scopes: frozenset[str] = ROLES[DEFAULT_ROLE]

    def may(self, scope: str) -> bool:
        return scope in self.scopes


def agent_principal(agent: str) -> Principal:
    """A token of the configuration (``CSTP_AUTH_TOKENS``, the tokens file, the local token):
    workspace ``default``, role ``agent``."""
    return Principal(agent)
