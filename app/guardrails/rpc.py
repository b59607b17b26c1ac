"""Registers cstp.checkGuardrails and cstp.listGuardrails."""

from __future__ import annotations

from typing import Any

from app.rpc.context import CallContext
from app.rpc.errors import GUARDRAIL_EVAL_FAILED
from app.rpc.registry import Method, Registry

from .schemas import (
    CheckGuardrailsParams, CheckGuardrailsResult, ListGuardrailsParams, ListGuardrailsResult,
)
from .service import Request, check


async def check_guardrails(ctx: CallContext, p: CheckGuardrailsParams) -> dict[str, Any]:
    a = p.action
    request = Request(a.description, a.category, a.stakes, a.confidence, a.project, a.context)
    checked = await check(
        ctx, request, source="checkGuardrails", category_field="action.category"
    )
    return checked.wire(ctx.agent)


async def list_guardrails(ctx: CallContext, p: ListGuardrailsParams) -> dict[str, Any]:
    rules = ctx.services.rules
    chosen = rules.rules if p.scope is None else rules.applicable(p.scope)
    return {
        "guardrails": [rule.as_dict() for rule in chosen],
        "count": len(chosen),
        "agent": ctx.agent,
        "ruleSetVersion": rules.version,
    }


def register(registry: Registry) -> None:
    registry.add(Method(
        "cstp.checkGuardrails", CheckGuardrailsParams, CheckGuardrailsResult, check_guardrails,
        "Evaluate an action against the guardrails; the evaluation is stored for audit.",
        errors=(GUARDRAIL_EVAL_FAILED,),
    ))
    registry.add(Method(
        "cstp.listGuardrails", ListGuardrailsParams, ListGuardrailsResult, list_guardrails,
        "The guardrails in force, optionally only those that apply to one project (scope).",
        writes=False,
    ))
