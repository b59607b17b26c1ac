"""The audited tables, and what of each the canonical form covers (app.audit.canonical): the
fixed column lists, the child tables and their natural keys, the order of chaining. A column
added to a table later is covered only by a new ``FORMAT``, which lists it in ``later``."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Table

from app.db.approvals import Approval, ApprovalDecision
from app.db.base import table_of
from app.db.briefs import SessionBrief
from app.db.decisions import (
    Decision,
    DecisionReason,
    DecisionReview,
    DecisionSupersede,
    DecisionTag,
)
from app.db.guardrails import GuardrailEvaluation, GuardrailRuleResult
from app.db.intents import Intent, IntentMatch
from app.db.tokens import ApiTokenGrant

FORMAT = 6
"""The canonical form's format: the column lists below. Any change to them is a new format.
Format 2 adds ``intents.search_degraded`` (revision 0011) as a ``later`` column; format 3 the
``workspace`` of every audited row (revision 0012), a member only for another workspace than
``default``; format 4 (revision 0016) ``guardrail_evaluations.escalations`` and
``approval_id`` and ``guardrail_rule_results.would_escalate`` as ``later`` columns (NULL
unless an escalate rule applied), and the approvals tables; format 5 (revision 0018)
``decision_reviews.source`` (a member only when not ``agent``) and
``decisions.quality_flags`` (only when not NULL); format 6 (revision 0019) the child table
``decision_supersedes`` of ``decisions``, a member only when the decision has links
(``Child.optional``); and ``session_briefs`` (revision 0021), a table of its own."""

WORKSPACE = (("workspace", "default"),)


@dataclass(frozen=True)
class Child:
    table: Table
    parent: str  # the column that names the parent row
    columns: tuple[str, ...]
    order: tuple[str, ...]  # the natural key the rows are ordered by
    # Columns a later format added: a member of a child row only when not NULL (as
    # ``Audited.later``).
    later: tuple[str, ...] = ()
    # A child table a later format added: a member of its parent's form only when the parent
    # has rows in it, so that the rows stored before it (which have none) keep their digests.
    optional: bool = False


@dataclass(frozen=True)
class Audited:
    """An audited table: its key, creation time, covered columns and child tables."""

    table: Table
    key: str
    time: str  # the column that says when the row was created
    columns: tuple[str, ...]
    children: tuple[Child, ...] = ()
    # Columns a later format added: each is a member of the form only when it is not NULL, so
    # that the rows stored before it (NULL there) keep their digests.
    later: tuple[str, ...] = ()
    # Columns a later format added with a default value (column, default): each is a member
    # only when its value is another, so that the rows stored before keep their digests.
    later_defaults: tuple[tuple[str, str], ...] = WORKSPACE

    @property
    def name(self) -> str:
        # a plain str: SQLAlchemy's quoted_name is a subclass, which msgspec does not encode
        return str(self.table.name)


INTENTS = Audited(
    table_of(Intent),
    "id",
    "received_at",
    (
        "id",
        "correlation_id",
        "agent",
        "received_at",
        "outcome",
        "error_code",
        "intent",
        "context",
        "category",
        "stakes",
        "confidence",
        "metadata",
        "claimed_agent",
        "request_hash",
        "allowed",
        "evaluation_id",
        "similar_found",
        "response",
    ),
    (
        Child(
            table_of(IntentMatch),
            "intent_id",
            ("decision_id", "rank", "distance", "outcome"),
            ("rank",),
        ),
    ),
    later=("search_degraded",),
)
EVALUATIONS = Audited(
    table_of(GuardrailEvaluation),
    "id",
    "evaluated_at",
    (
        "id",
        "agent",
        "source",
        "evaluated_at",
        "description",
        "category",
        "stakes",
        "confidence",
        "project",
        "facts",
        "allowed",
        "evaluated",
        "violations",
        "warnings",
        "rule_set_version",
        "rule_set_hash",
    ),
    (
        Child(
            table_of(GuardrailRuleResult),
            "evaluation_id",
            (
                "guardrail_id",
                "severity",
                "mode",
                "fired",
                "would_block",
                "would_warn",
                "message",
                "error",
            ),
            ("guardrail_id",),
            later=("would_escalate",),
        ),
    ),
    later=("escalations", "approval_id"),
)
DECISIONS = Audited(
    table_of(Decision),
    "id",
    "created_at",
    (
        "id",
        "summary",
        "decision",
        "category",
        "confidence",
        "stakes",
        "created_at",
        "recorded_by",
        "context",
        "mental_state",
        "review_in",
        "review_by",
        "kpi_indicators",
        "pre_query_run",
        "pre_similar_found",
        "pre_guardrails_checked",
        "pre_guardrails_passed",
        "project",
        "feature",
        "pr",
        "file",
        "line",
        "commit",
        "intent_id",
        "correlation_id",
        "guardrail_evaluation_id",
    ),
    (
        Child(
            table_of(DecisionReason),
            "decision_id",
            ("position", "type", "text", "strength"),
            ("position",),
        ),
        Child(table_of(DecisionTag), "decision_id", ("tag", "position"), ("position", "tag")),
        Child(
            table_of(DecisionSupersede),
            "decision_id",
            ("superseded_id", "position"),
            ("position",),
            optional=True,
        ),
    ),
    later=("quality_flags",),
)
REVIEWS = Audited(
    table_of(DecisionReview),
    "id",
    "reviewed_at",
    (
        "id",
        "decision_id",
        "outcome",
        "actual_result",
        "lessons",
        "notes",
        "affected_kpis",
        "reviewed_by",
        "reviewed_at",
    ),
    later_defaults=(*WORKSPACE, ("source", "agent")),
)

# Token grants (revision 0013): every column, the workspace among them (the table is newer
# than workspaces, so no stored row lacks one), never the secret, only its SHA-256.
TOKEN_GRANTS = Audited(
    table_of(ApiTokenGrant),
    "id",
    "acted_at",
    (
        "id",
        "token_id",
        "workspace",
        "action",
        "agent",
        "role",
        "scopes",
        "expires_at",
        "secret_sha256",
        "acted_at",
        "acted_by",
    ),
    later_defaults=(),
)

# Approvals (revision 0016): every column, the workspace among them (newer than workspaces).
APPROVALS = Audited(
    table_of(Approval),
    "id",
    "created_at",
    (
        "id",
        "workspace",
        "evaluation_id",
        "source",
        "requested_by",
        "correlation_id",
        "action",
        "action_sha256",
        "rules",
        "created_at",
        "expires_at",
    ),
    later_defaults=(),
)
APPROVAL_DECISIONS = Audited(
    table_of(ApprovalDecision),
    "approval_id",
    "decided_at",
    ("approval_id", "workspace", "verdict", "decided_by", "decided_at", "reason"),
    later_defaults=(),
)

# Session briefs (revision 0021): every column, what the agent was shown among them.
SESSION_BRIEFS = Audited(
    table_of(SessionBrief),
    "id",
    "created_at",
    (
        "id",
        "workspace",
        "agent",
        "task",
        "format",
        "max_tokens",
        "tokens",
        "content",
        "created_at",
    ),
    later_defaults=(),
)

AUDITED: dict[str, Audited] = {
    a.name: a
    for a in (
        EVALUATIONS,
        INTENTS,
        DECISIONS,
        REVIEWS,
        TOKEN_GRANTS,
        APPROVALS,
        APPROVAL_DECISIONS,
        SESSION_BRIEFS,
    )
}
"""Every audited table, by name; in the order rows created at the same instant are chained
by the migration that built the chain over existing rows (an evaluation before the intent or
decision that refers to it)."""


@dataclass(frozen=True)
class Covered:
    """What one chain entry covers: a row (table and key, as text) and its digest."""

    table: str
    row_id: str
    digest: str
    workspace: str = "default"  # the row's (its chain entry is of the same workspace)
