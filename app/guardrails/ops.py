"""The guardrail operations: checkGuardrails and listGuardrails."""

from __future__ import annotations

from app import scopes
from app.errors import CONFLICT, DECISION_NOT_FOUND, GUARDRAIL_EVAL_FAILED
from app.operations.context import CallContext
from app.operations.params import known_category
from app.operations.registry import Operation, Registry

from .rules import Condition, Rule, timeout_text
from .schemas import (
    CheckGuardrailsParams,
    CheckGuardrailsResult,
    ConditionOut,
    GuardrailOut,
    ListGuardrailsParams,
    ListGuardrailsResult,
)
from .service import Request, check


async def check_guardrails(ctx: CallContext, p: CheckGuardrailsParams) -> CheckGuardrailsResult:
    a = p.action
    if a.category is not None:
        known_category(a.category, ctx.services.settings.categories, "action.category")
    request = Request(a.description, a.category, a.stakes, a.confidence, a.project, a.context)
    checked = await check(ctx, request, source="checkGuardrails", approval_id=p.approval_id)
    return checked.result(ctx.agent)


async def list_guardrails(ctx: CallContext, p: ListGuardrailsParams) -> ListGuardrailsResult:
    rules = ctx.services.rules
    chosen = rules.rules if p.scope is None else rules.applicable(p.scope)
    return ListGuardrailsResult(
        guardrails=[_listed(rule) for rule in chosen],
        count=len(chosen),
        agent=ctx.agent,
        rule_set_version=rules.version,
    )


def _listed(rule: Rule) -> GuardrailOut:
    """The public description of a rule (``Rule.as_dict`` is the same, for its version)."""
    return GuardrailOut(
        id=rule.id,
        description=rule.description,
        action=rule.action,
        mode=rule.mode,
        scope=list(rule.scope),
        conditions=[_condition(c) for c in rule.conditions],
        requirements=[_condition(c) for c in rule.requirements],
        suggestion=rule.suggestion,
        timeout=None if rule.timeout is None else timeout_text(rule.timeout),
    )


def _condition(c: Condition) -> ConditionOut:
    value = list(c.value) if isinstance(c.value, tuple) else c.value
    return ConditionOut(field=c.field, operator=c.op, value=value, op=c.op)


def register(registry: Registry) -> None:
    registry.add(
        Operation(
            "cstp.checkGuardrails",
            CheckGuardrailsParams,
            CheckGuardrailsResult,
            check_guardrails,
            "Evaluate an action against the guardrails; the evaluation is stored for audit.",
            "Check whether the organisation's guardrails allow an action, without announcing it: "
            "give its description, category, stakes, your confidence and the facts the rules "
            "read (context, e.g. affects_production, code_review). Answers allowed (false: a "
            "blocking rule fired, do not proceed), the violations and warnings with suggestions. "
            "When a rule asks for a person's approval, escalation names it (approvalId, status, "
            "expiresAt): once it is approved, check again with that approvalId.",
            errors=(GUARDRAIL_EVAL_FAILED, DECISION_NOT_FOUND, CONFLICT),
            tool="check_guardrails",
            scopes=(scopes.ANNOUNCE,),
        )
    )
    registry.add(
        Operation(
            "cstp.listGuardrails",
            ListGuardrailsParams,
            ListGuardrailsResult,
            list_guardrails,
            "The guardrails in force, optionally only those that apply to one project (scope).",
            "List the guardrail rules in force (optionally those of one project scope): what each "
            "checks, whether it blocks or warns, and its suggestion. Use it to know the rules "
            "before planning an action.",
            writes=False,
            tool="list_guardrails",
            scopes=(scopes.READ,),
        )
    )
