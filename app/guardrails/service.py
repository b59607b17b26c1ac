"""Evaluate guardrails for a request and store the evaluation as rows.

Used by checkGuardrails, announceIntent and recordDecision alike, so every check an agent
causes is stored the same way, with the exact rule set in force (its content is stored once
per content hash in ``guardrail_rule_sets``, for ``cstp guardrails replay``), and chained in
the audit trail (app.audit) in the same transaction.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from sqlalchemy import Engine, event
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from app.approvals import service as approvals
from app.approvals.schemas import Escalation
from app.audit.canonical import Covered, covered
from app.audit.chain import append
from app.errors import GUARDRAIL_EVAL_FAILED, CstpError
from app.operations.context import CallContext
from app.runtime import iso
from app.webhooks import GUARDRAIL_BLOCKED, Message, enqueue_many, message

from . import repository
from .evaluate import Evaluation, RuleCheck, RuleResult, evaluate
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


def action_of(request: Request) -> dict[str, Any]:
    """The action as an approval keeps it: what was evaluated, as the caller gave it."""
    return {
        "description": request.description,
        "category": request.category,
        "stakes": request.stakes,
        "confidence": request.confidence,
        "project": request.project,
        "context": _jsonable(dict(request.context)),
    }


def scope_of(request: Request) -> str | None:
    if request.project:
        return request.project
    project = request.context.get("project")
    return project if isinstance(project, str) else None


@dataclass(frozen=True)
class Checked:
    """An evaluation's verdict as answered; ``escalation`` is the approval an escalated one
    asked for (or already had), which allows the action once approved."""

    evaluation: Evaluation
    evaluation_id: str
    evaluated_at: str
    escalation: Escalation | None = None

    @property
    def allowed(self) -> bool:
        if self.escalation is not None and self.evaluation.escalated:
            return self.escalation.status == "approved"
        return self.evaluation.allowed

    def result(self, agent: str) -> CheckGuardrailsResult:
        """The checkGuardrails answer: the verdict, when, for whom and by which rule set."""
        ev = self.evaluation
        return CheckGuardrailsResult(
            allowed=self.allowed,
            violations=hits(ev.violations),
            warnings=hits(ev.warnings),
            evaluated=ev.evaluated,
            evaluated_at=self.evaluated_at,
            agent=agent,
            evaluation_id=self.evaluation_id,
            rule_set_version=ev.version,
            escalation=self.escalation,
        )

    def status(self) -> GuardrailStatus:
        """The verdict as announceIntent's ``guardrailStatus``: the same hits and counts."""
        ev = self.evaluation
        return GuardrailStatus(
            allowed=self.allowed,
            violations=hits(ev.violations),
            warnings=hits(ev.warnings),
            evaluated=ev.evaluated,
            evaluation_id=self.evaluation_id,
            escalation=self.escalation,
        )


def hits(results: Sequence[RuleResult]) -> list[GuardrailHit]:
    """The rules that fired, as both answers list them."""
    return [
        GuardrailHit(
            guardrail_id=r.guardrail_id,
            name=r.name,
            message=r.message,
            # hits are of block and warn rules (escalate rules fire as an ``escalation``)
            severity=cast(Literal["block", "warn"], r.severity),
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
    request: Request

    @functools.cached_property
    def entry(self) -> Covered:
        """Its audit chain entry: the rows' digest, computed when first asked for (a caller
        with more rows to digest may ask early, to compute all its digests together)."""
        return covered(
            "guardrail_evaluations", self.row, {"guardrail_rule_results": self.rule_rows}
        )

    def escalate(
        self,
        ctx: CallContext,
        existing: Any,
        correlation_id: str | None,
        *,
        stated: str | None = None,
    ) -> tuple[Staged, approvals.Requested | None]:
        """This escalated evaluation with its approval: ``existing`` (a row of
        app.approvals.repository: the request already has one) or a new one, returned to be
        written with the evaluation (app.approvals.service.resolve). ``stated``: the free
        text an announcement gave with its intent (its ``context``), which the approver is
        shown and the approval covers. The evaluation's row then records the verdict
        answered (``allowed``: true once approved) and the approval (``approval_id``)."""
        ev = self.checked.evaluation
        assert ev.escalated and ev.timeout is not None
        action = action_of(self.request)
        if stated is not None:
            action["statedContext"] = stated
        escalation, requested = approvals.resolve(
            ctx,
            existing=existing,
            evaluation_id=self.checked.evaluation_id,
            source=self.row["source"],
            correlation_id=correlation_id,
            action=action,
            rules=[r.guardrail_id for r in ev.escalations],
            timeout=ev.timeout,
            renew=correlation_id is None,
        )
        checked = dataclasses.replace(self.checked, escalation=escalation)
        row = {**self.row, "allowed": checked.allowed, "approval_id": escalation.approval_id}
        return dataclasses.replace(self, checked=checked, row=row), requested


def rule_columns(check: RuleCheck) -> dict[str, Any]:
    """A rule's result as ``guardrail_rule_results`` stores it (and a replay compares it):
    ``would_escalate`` is an escalate rule's only, NULL for the others (as before 0016)."""
    return {
        "guardrail_id": check.guardrail_id,
        "severity": check.severity,
        "mode": check.mode,
        "fired": check.fired,
        "would_block": check.would and check.severity == "block",
        "would_warn": check.would and check.severity == "warn",
        "would_escalate": check.would if check.severity == "escalate" else None,
        "message": check.message,
        "error": check.error,
    }


def evaluate_request(ctx: CallContext, request: Request, source: str) -> Staged:
    """Evaluate (no I/O). -32004 only when no applicable rule could be evaluated. The caller
    has validated the request's category (app.operations.params.known_category). Traced as
    the GenAI conventions' ``apply_guardrail`` when tracing is on."""
    if ctx.span is None:
        return _evaluate(ctx, request, source)
    with ctx.span.guardrail() as traced:
        staged = _evaluate(ctx, request, source)
        ev = staged.checked.evaluation
        traced.evaluated(
            staged.checked.evaluation_id,
            ev.version,
            staged.rule_set.hash,
            allowed=ev.allowed,
            violations=len(ev.violations),
            warnings=len(ev.warnings),
            description=request.description,
        )
        return staged


def _evaluate(ctx: CallContext, request: Request, source: str) -> Staged:
    facts = facts_of(request)
    rules = ctx.services.rules
    evaluation = evaluate(rules, facts, scope_of(request))
    if evaluation.failed:
        raise CstpError(
            GUARDRAIL_EVAL_FAILED,
            "Guardrail evaluation failed: no rule could be evaluated for this request",
        )
    ctx.services.metrics.verdicts(evaluation.results)
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
        # NULL unless an escalate rule fired: the rows of the others are as before 0016
        "escalations": len(evaluation.escalations) or None,
        "approval_id": None,  # an escalated one's, set by Staged.escalate
    }
    rule_rows = [
        {"evaluation_id": evaluation_id, "workspace": ctx.workspace, **rule_columns(c)}
        for c in evaluation.results
    ]
    return Staged(Checked(evaluation, evaluation_id, iso(now)), row, rule_rows, rules, request)


async def store(
    session: AsyncSession,
    staged: Sequence[Staged],
    requested: Sequence[approvals.Requested] = (),
) -> None:
    """Write evaluations: their rule sets when not stored yet, one insert for the evaluation
    rows, then one for all their per-rule rows, the approvals they asked for, and their audit
    chain entries (written when the transaction commits). Plain Core inserts: nothing reads
    these rows back as ORM objects."""
    if not staged:
        return
    # digested before the first statement: on SQLite that takes the write lock
    entries = [s.entry for s in staged]
    await _store_rule_sets(session, {s.rule_set.hash: s.rule_set for s in staged})
    rule_rows = [r for s in staged for r in s.rule_rows]
    await repository.insert_evaluations(session, [s.row for s in staged], rule_rows)
    append(session, *entries)
    await approvals.store(session, requested)
    blocked = [s for s in staged if s.checked.evaluation.violations and s.row["source"] in ACTING]
    if blocked:
        await enqueue_many(session, [_blocked_message(s) for s in blocked])


# The calls whose action a block stops (recordDecision's evaluation never blocks recording).
ACTING = ("announceIntent", "checkGuardrails")


def _blocked_message(staged: Staged) -> Message:
    """The ``guardrail.blocked`` webhook of a blocked evaluation."""
    row = staged.row
    data = {
        "evaluationId": row["id"],
        "workspace": row["workspace"],
        "agent": row["agent"],
        "source": row["source"],
        "description": row["description"],
        "category": row["category"],
        "stakes": row["stakes"],
        "violations": [v.guardrail_id for v in staged.checked.evaluation.violations],
        "evaluatedAt": row["evaluated_at"],
    }
    return message(
        workspace=row["workspace"],
        event=GUARDRAIL_BLOCKED,
        data=data,
        at=row["evaluated_at"],
        message_id=f"msg_guardrail_blocked_{row['id']}",
    )


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


async def check(
    ctx: CallContext, request: Request, source: str, approval_id: str | None = None
) -> Checked:
    """Evaluate and store in the call's transaction (see ``evaluate_request``). An escalated
    evaluation asks for a new approval, or, given ``approval_id`` (an approval this agent
    asked for, else -32007), answers with that one's status."""
    existing = None if approval_id is None else await approvals.own(ctx, approval_id)
    staged = evaluate_request(ctx, request, source)
    requested = None
    if staged.checked.evaluation.escalated:
        staged, requested = staged.escalate(ctx, existing, None)
    await store(ctx.session, [staged], [requested] if requested else [])
    return staged.checked


def _jsonable(facts: dict[str, Any]) -> dict[str, Any]:
    plain: dict[str, Any] = json.loads(json.dumps(facts, default=str))
    return plain
