"""Replaying a stored guardrail evaluation with the rule set it used (``cstp guardrails
replay``).

Every evaluation records the SHA-256 of its rule set's content, stored once per hash in
``guardrail_rule_sets``. A replay reads the evaluation's stored inputs (its facts and project
scope), rebuilds that rule set from the stored content (after checking the content still
hashes to its key), evaluates again, and compares the verdict and every rule's result with
what was stored.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

from app.approvals import repository as approvals

from . import repository
from .evaluate import evaluate
from .repository import RESULT_FIELDS
from .rules import RuleSet, rule_set_from_content
from .service import rule_columns

_FLAGS = ("fired", "would_block", "would_warn", "would_escalate")


class CannotReplay(Exception):
    """The evaluation is unknown, or its rule set cannot be had; the message says which."""


@dataclass
class Replayed:
    evaluation: dict[str, Any]  # the stored guardrail_evaluations row
    rule_set: RuleSet
    allowed: bool  # the replayed verdict (an escalation's: as its approval then stood)
    counts: tuple[int, int, int]  # replayed (evaluated, violations, warnings)
    escalations: int  # replayed: the escalate rules that fired or failed
    # The approval the evaluation asked for, with its decision (app.approvals.repository)
    approval: Any = None
    differences: list[str] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return not self.differences


def verdict_word(violations: int, escalations: int | None) -> str:
    """blocked, escalated (asked a person: no block rule fired) or allowed."""
    if violations:
        return "blocked"
    return "escalated" if escalations else "allowed"


def _rule_set(conn: Connection, evaluation: dict[str, Any]) -> RuleSet:
    wanted = evaluation["rule_set_hash"]
    if wanted is None:
        raise CannotReplay(
            f"evaluation {evaluation['id']} was stored before rule sets were kept "
            f"(rule set version {evaluation['rule_set_version']}): it cannot be replayed"
        )
    content = repository.rule_set_content(conn, wanted)
    if content is None:
        raise CannotReplay(f"the rule set {wanted} of evaluation {evaluation['id']} is not stored")
    if hashlib.sha256(content.encode("utf-8")).hexdigest() != wanted:
        raise CannotReplay(
            f"the stored rule set {wanted} does not hash to its key: its content was edited"
        )
    try:
        return rule_set_from_content(content, source=f"rule set {wanted}")
    except ValueError as exc:
        raise CannotReplay(f"the stored rule set {wanted} cannot be read: {exc}") from None


def replay(conn: Connection, evaluation_id: str) -> Replayed:
    """Evaluate a stored evaluation's inputs again with its own rule set and compare."""
    try:
        row = repository.evaluation(conn, evaluation_id)
        kept = repository.rule_results(conn, evaluation_id)
    except ValueError:  # a value that does not parse (bad JSON, a timestamp that is none)
        raise CannotReplay(
            f"the evaluation {evaluation_id!r} or one of its rule results holds a value that "
            "cannot be read (an edited row: cstp audit verify names it)"
        ) from None
    if row is None:
        raise CannotReplay(f"no guardrail evaluation with id {evaluation_id!r}")
    stored = row
    if not isinstance(stored["facts"], dict | None):
        raise CannotReplay(
            f"the evaluation {evaluation_id!r} has facts that are not a JSON object (an edited "
            "row: cstp audit verify names it)"
        )
    rule_set = _rule_set(conn, stored)
    ev = evaluate(rule_set, stored["facts"] or {}, stored["project"])
    replayed = {c.guardrail_id: rule_columns(c) for c in ev.results}
    counts = (ev.evaluated, len(ev.violations), len(ev.warnings))
    approval = (
        approvals.by_any_id(conn, stored["approval_id"])
        if stored.get("approval_id")
        else approvals.by_evaluation(conn, evaluation_id)
    )
    allowed = ev.allowed
    if ev.escalated and approval is not None:
        # the verdict answered: allowed when the approval was approved before this check
        allowed = approval.verdict == "approved" and approval.decided_at <= stored["evaluated_at"]
    out = Replayed(stored, rule_set, allowed, counts, len(ev.escalations), approval)
    if bool(stored["allowed"]) != out.allowed:
        out.differences.append(
            f"allowed: stored {_text(stored['allowed'])}, replayed {_text(out.allowed)}"
        )
    for name, value in zip(("evaluated", "violations", "warnings"), counts, strict=True):
        if stored[name] != value:
            out.differences.append(f"{name}: stored {stored[name]}, replayed {value}")
    if (stored.get("escalations") or 0) != out.escalations:
        out.differences.append(
            f"escalations: stored {stored.get('escalations') or 0}, replayed {out.escalations}"
        )
    for rule_id in sorted(kept.keys() | replayed.keys()):
        before, after = kept.get(rule_id), replayed.get(rule_id)
        if before is None:
            out.differences.append(f"rule {rule_id}: applied now, not stored")
        elif after is None:
            out.differences.append(f"rule {rule_id}: stored, does not apply now")
        else:
            for f in RESULT_FIELDS:
                kept_value = before[f]
                if f in _FLAGS and kept_value is not None:  # SQLite may hand back 0/1
                    kept_value = bool(kept_value)
                if kept_value != after[f]:
                    out.differences.append(
                        f"rule {rule_id}: {f} stored {_text(before[f])}, replayed {_text(after[f])}"
                    )
    return out


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else repr(value) if isinstance(value, str) else str(value)
