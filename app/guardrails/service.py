"""Evaluate guardrails for a request and store the evaluation as rows.

Used by checkGuardrails, announceIntent and recordDecision alike, so every check an agent
causes is stored the same way, with the version of the rule set in force.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.base import table_of
from app.db.guardrails import GuardrailEvaluation, GuardrailRuleResult
from app.errors import GUARDRAIL_EVAL_FAILED, CstpError, invalid_params
from app.operations.context import CallContext
from app.runtime import iso

from .evaluate import Evaluation, evaluate

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

    def wire(self, agent: str) -> dict[str, Any]:
        ev = self.evaluation
        return {
            "allowed": ev.allowed,
            "violations": [v.as_dict() for v in ev.violations],
            "warnings": [w.as_dict() for w in ev.warnings],
            "evaluated": ev.evaluated,
            "evaluatedAt": self.evaluated_at,
            "agent": agent,
            "evaluationId": self.evaluation_id,
            "ruleSetVersion": ev.version,
        }


@dataclass(frozen=True)
class Staged:
    """An evaluation and the rows that store it, built but not yet written."""

    checked: Checked
    row: dict[str, Any]  # the guardrail_evaluations row, by column
    rule_rows: list[dict[str, Any]]


def evaluate_request(
    ctx: CallContext, request: Request, source: str, *, category_field: str = "category"
) -> Staged:
    """Evaluate (no I/O). -32004 only when no applicable rule could be evaluated.

    ``category_field`` is how the caller's params name the category, for the -32602 answer."""
    settings = ctx.services.settings
    if request.category is not None and request.category not in settings.categories:
        raise invalid_params(category_field, "must be one of: " + ", ".join(settings.categories))
    facts = facts_of(request)
    evaluation = evaluate(ctx.services.rules, facts, scope_of(request))
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
    }
    messages = {r.guardrail_id: r.message for r in (*evaluation.violations, *evaluation.warnings)}
    rule_rows = [
        {
            "evaluation_id": evaluation_id,
            "guardrail_id": c.guardrail_id,
            "severity": c.severity,
            "fired": c.fired,
            "message": messages.get(c.guardrail_id),
            "error": c.error,
        }
        for c in evaluation.results
    ]
    return Staged(Checked(evaluation, evaluation_id, iso(now)), row, rule_rows)


async def store(session: AsyncSession, staged: Sequence[Staged]) -> None:
    """Write evaluations: one insert for the evaluation rows, then one for all their per-rule
    rows. Plain Core inserts: nothing reads these rows back as ORM objects."""
    if not staged:
        return
    await session.execute(insert(table_of(GuardrailEvaluation)), [s.row for s in staged])
    rule_rows = [r for s in staged for r in s.rule_rows]
    if rule_rows:
        await session.execute(insert(table_of(GuardrailRuleResult)), rule_rows)


async def check(
    ctx: CallContext, request: Request, source: str, *, category_field: str = "category"
) -> Checked:
    """Evaluate and store in the call's transaction (see ``evaluate_request``)."""
    staged = evaluate_request(ctx, request, source, category_field=category_field)
    await store(ctx.session, [staged])
    return staged.checked


def _jsonable(facts: dict[str, Any]) -> dict[str, Any]:
    plain: dict[str, Any] = json.loads(json.dumps(facts, default=str))
    return plain
