"""Evaluate guardrails for a request and store the evaluation as rows.

Used by checkGuardrails, announceIntent and recordDecision alike, so every check an agent
causes is stored the same way, with the exact rule set in force (its content is stored once
per content hash in ``guardrail_rule_sets``, for ``cstp guardrails replay``), and chained in
the audit trail (app.audit) in the same transaction.
"""

from __future__ import annotations

import functools
import json
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from app.audit.canonical import Covered, covered
from app.audit.chain import append
from app.errors import GUARDRAIL_EVAL_FAILED, CstpError
from app.operations.context import CallContext
from app.runtime import iso

from . import repository
from .evaluate import Evaluation, RuleResult, evaluate
from .rules import RuleSet
from .schemas import CheckGuardrailsResult, GuardrailHit, GuardrailStatus

CORE_FIELDS = ("description", "category", "stakes", "confidence")


@dataclass(frozen=True)
class Request:
    description: str
    category: str | None
    stakes: str | None
    confidence: float | None
    project: str | None
    context: Mapping[str, Any]


def facts_of(request: Request) -> dict[str, Any]:
    """Context keys first, then the core fields, which context can never override."""
    facts = {k: v for k, v in request.context.items() if k not in CORE_FIELDS}
    facts.update(
        description=request.description,
        category=request.category,
        stakes=request.stakes,
        confidence=request.confidence,
    )
    if request.project is not None:
        facts["project"] = request.project
    return {k: v for k, v in facts.items() if v is not None}


def scope_of(request: Request) -> str | None:
    if request.project:
        return request.project
    project = request.context.get("project")
    return project if isinstance(project, str) else None


@dataclass(frozen=True)
class Checked:
    evaluation: Evaluation
    evaluation_id: str
    evaluated_at: str

    def result(self, agent: str) -> CheckGuardrailsResult:
        """The checkGuardrails answer: the verdict, when, for whom and by which rule set."""
        ev = self.evaluation
        return CheckGuardrailsResult(
            allowed=ev.allowed,
            violations=hits(ev.violations),
            warnings=hits(ev.warnings),
            evaluated=ev.evaluated,
            evaluated_at=self.evaluated_at,
            agent=agent,
            evaluation_id=self.evaluation_id,
            rule_set_version=ev.version,
        )

    def status(self) -> GuardrailStatus:
        """The verdict as announceIntent's ``guardrailStatus``: the same hits and counts."""
        ev = self.evaluation
        return GuardrailStatus(
            allowed=ev.allowed,
            violations=hits(ev.violations),
            warnings=hits(ev.warnings),
            evaluated=ev.evaluated,
            evaluation_id=self.evaluation_id,
        )


def hits(results: Sequence[RuleResult]) -> list[GuardrailHit]:
    """The rules that fired, as both answers list them."""
    return [
        GuardrailHit(
            guardrail_id=r.guardrail_id,
            name=r.name,
            message=r.message,
            severity=r.severity,
            suggestion=r.suggestion,
        )
        for r in results
    ]


@dataclass(frozen=True)
class Staged:
    """An evaluation and the rows that store it, built but not yet written."""

    checked: Checked
    row: dict[str, Any]  # the guardrail_evaluations row, by column
    rule_rows: list[dict[str, Any]]
    rule_set: RuleSet

    @functools.cached_property
    def entry(self) -> Covered:
        """Its audit chain entry: the rows' digest, computed when first asked for (a caller
        with more rows to digest may ask early, to compute all its digests together)."""
        return covered(
            "guardrail_evaluations", self.row, {"guardrail_rule_results": self.rule_rows}
        )


def evaluate_request(ctx: CallContext, request: Request, source: str) -> Staged:
    """Evaluate (no I/O). -32004 only when no applicable rule could be evaluated. The caller
    has validated the request's category (app.operations.params.known_category)."""
    facts = facts_of(request)
    rules = ctx.services.rules
    evaluation = evaluate(rules, facts, scope_of(request))
    if evaluation.failed:
        raise CstpError(
            GUARDRAIL_EVAL_FAILED,
            "Guardrail evaluation failed: no rule could be evaluated for this request",
        )
    now = ctx.services.runtime.now()
    evaluation_id = ctx.services.runtime.uuid()
    row = {
        "id": evaluation_id,
        "agent": ctx.agent,
        "workspace": ctx.workspace,
        "source": source,
        "evaluated_at": now,
        "description": request.description,
        "category": request.category,
        "stakes": request.stakes,
        "confidence": request.confidence,
        "project": scope_of(request),
        "facts": _jsonable(facts),
        "allowed": evaluation.allowed,
        "evaluated": evaluation.evaluated,
        "violations": len(evaluation.violations),
        "warnings": len(evaluation.warnings),
        "rule_set_version": evaluation.version,
        "rule_set_hash": rules.hash,
    }
    rule_rows = [
        {
            "evaluation_id": evaluation_id,
            "workspace": ctx.workspace,
            "guardrail_id": c.guardrail_id,
            "severity": c.severity,
            "mode": c.mode,
            "fired": c.fired,
            "would_block": c.would and c.severity == "block",
            "would_warn": c.would and c.severity == "warn",
            "message": c.message,
            "error": c.error,
        }
        for c in evaluation.results
    ]
    return Staged(Checked(evaluation, evaluation_id, iso(now)), row, rule_rows, rules)


async def store(session: AsyncSession, staged: Sequence[Staged]) -> None:
    """Write evaluations: their rule sets when not stored yet, one insert for the evaluation
    rows, then one for all their per-rule rows, and their audit chain entries (written when
    the transaction commits). Plain Core inserts: nothing reads these rows back as ORM
    objects."""
    if not staged:
        return
    # digested before the first statement: on SQLite that takes the write lock
    entries = [s.entry for s in staged]
    await _store_rule_sets(session, {s.rule_set.hash: s.rule_set for s in staged})
    rule_rows = [r for s in staged for r in s.rule_rows]
    await repository.insert_evaluations(session, [s.row for s in staged], rule_rows)
    append(session, *entries)


# The rule sets known to be stored, per database engine: once a process has seen its rule
# set committed, its evaluations cost no statement more.
_stored_rule_sets: weakref.WeakKeyDictionary[Engine, set[str]] = weakref.WeakKeyDictionary()


async def _store_rule_sets(session: AsyncSession, rule_sets: Mapping[str, RuleSet]) -> None:
    """Store each rule set this process has not seen committed yet
    (``repository.insert_rule_set``)."""
    bind = session.get_bind()
    assert isinstance(bind, Engine)  # sessions are bound to engines here, not connections
    known = _stored_rule_sets.setdefault(bind, set())
    missing = [rs for h, rs in rule_sets.items() if h not in known]
    if not missing:
        return
    postgres = bind.dialect.name == "postgresql"
    for rule_set in missing:
        row = {
            "hash": rule_set.hash,
            "version": rule_set.version,
            "rules": len(rule_set.rules),
            "content": rule_set.content,
        }
        await repository.insert_rule_set(session, row, postgres=postgres)

    def remember(_session: Session) -> None:
        known.update(rs.hash for rs in missing)

    event.listen(session.sync_session, "after_commit", remember, once=True)


async def check(ctx: CallContext, request: Request, source: str) -> Checked:
    """Evaluate and store in the call's transaction (see ``evaluate_request``)."""
    staged = evaluate_request(ctx, request, source)
    await store(ctx.session, [staged])
    return staged.checked


def _jsonable(facts: dict[str, Any]) -> dict[str, Any]:
    plain: dict[str, Any] = json.loads(json.dumps(facts, default=str))
    return plain
