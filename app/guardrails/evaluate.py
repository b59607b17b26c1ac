"""Evaluation of a loaded rule set against one request's facts.

Pure and synchronous: no I/O, so the same facts and rule set always give the same verdict and
the caller can store that verdict (with ``version``) for audit. A rule that cannot be evaluated
fails closed when it blocks: a type mix-up in a request must never wave a risky action through.
A shadow rule is evaluated the same way, but only its audit record (``RuleCheck.would``) says
what it would have done: it never touches the verdict, the counts or the answer.

An escalate rule that fires asks for a person's approval (SPEC.md, section 8); one that cannot
be evaluated fails closed the same way (it asks). Block always wins: when a block rule fires
too, the evaluation is blocked, not escalated, and nobody is asked.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from app.guardrails.rules import Action, Condition, Mode, Rule, RuleSet, Scalar

MAX_RENDERED_FACT = 200
"""Facts are caller input; a long one is cut so it cannot flood every message it appears in."""

_PLACEHOLDER = re.compile(r"\{([A-Za-z0-9_.-]+)\}")
_MISSING: Any = object()
_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


class GuardrailEvalError(Exception):
    """A condition compared incompatible types (e.g. a string fact with ``<`` and a number)."""


@dataclass(frozen=True)
class RuleResult:
    """A fired (or failed) rule as reported to the client; ``error`` is set only on failure."""

    guardrail_id: str
    name: str
    message: str
    severity: Action
    suggestion: str | None
    error: str | None = None


@dataclass(frozen=True)
class RuleCheck:
    """Audit record of one applicable rule: did it fire, or why could it not be evaluated.

    A shadow rule never fires; ``would`` says it would have blocked or warned (by its
    ``severity``) had it been enforced. ``message`` is set for a rule that fired, would have,
    or could not be evaluated."""

    guardrail_id: str
    severity: Action
    fired: bool
    error: str | None = None
    mode: Mode = "enforce"
    would: bool = False
    message: str | None = None


@dataclass(frozen=True)
class Evaluation:
    """The verdict. ``allowed`` is False exactly when an enforced block or escalate rule fired
    or failed; ``evaluated`` counts the enforced rules that applied (shadow ones are only in
    ``results``). ``escalations`` are the escalate rules that fired or failed; they ask for
    approval only when no block rule did (``escalated``)."""

    allowed: bool
    violations: tuple[RuleResult, ...]
    warnings: tuple[RuleResult, ...]
    escalations: tuple[RuleResult, ...]
    evaluated: int
    errors: int
    failed: bool
    results: tuple[RuleCheck, ...]
    version: str
    # Seconds until the approval expires: the shortest timeout of the escalations.
    timeout: int | None = None

    @property
    def escalated(self) -> bool:
        """A person must approve: an escalate rule fired and no block rule did."""
        return bool(self.escalations) and not self.violations


def evaluate(rule_set: RuleSet, facts: Mapping[str, Any], scope: str | None) -> Evaluation:
    """Evaluate every rule that applies to project ``scope``, in load order."""
    applicable = rule_set.applicable(scope)
    violations: list[RuleResult] = []
    warnings: list[RuleResult] = []
    escalations: list[RuleResult] = []
    timeouts: list[int] = []
    checks: list[RuleCheck] = []
    errors = enforced = 0
    for rule in applicable:
        shadow = rule.mode == "shadow"
        enforced += not shadow
        bucket = {"block": violations, "warn": warnings, "escalate": escalations}[rule.action]
        try:
            fired = rule_fires(rule, facts)
        except Exception as exc:  # any failure must fail closed, not crash
            detail = str(exc) or type(exc).__name__
            message = f"Guardrail '{rule.id}' could not be evaluated"
            if shadow:  # it would have failed closed (block) or warned
                checks.append(_shadow(rule, True, message, detail))
                continue
            errors += 1
            if rule.timeout is not None:
                timeouts.append(rule.timeout)
            checks.append(RuleCheck(rule.id, rule.action, False, detail, message=message))
            bucket.append(
                RuleResult(
                    guardrail_id=rule.id,
                    name=rule.description,
                    message=message,
                    severity=rule.action,
                    suggestion=None,
                    error=detail,
                )
            )
            continue
        rendered = render_message(rule.message, facts) if fired else None
        if shadow:
            checks.append(_shadow(rule, fired, rendered, None))
            continue
        checks.append(RuleCheck(rule.id, rule.action, fired=fired, message=rendered))
        if rendered is not None:
            if rule.timeout is not None:
                timeouts.append(rule.timeout)
            bucket.append(
                RuleResult(
                    guardrail_id=rule.id,
                    name=rule.description,
                    message=rendered,
                    severity=rule.action,
                    suggestion=rule.suggestion,
                )
            )
    return Evaluation(
        allowed=not violations and not escalations,
        violations=tuple(violations),
        warnings=tuple(warnings),
        escalations=tuple(escalations),
        evaluated=enforced,
        errors=errors,
        failed=bool(enforced) and errors == enforced,
        results=tuple(checks),
        version=rule_set.version,
        timeout=min(timeouts) if timeouts else None,
    )


def _shadow(rule: Rule, would: bool, message: str | None, error: str | None) -> RuleCheck:
    return RuleCheck(
        rule.id, rule.action, False, error, mode="shadow", would=would, message=message
    )


def rule_fires(rule: Rule, facts: Mapping[str, Any]) -> bool:
    """All conditions hold and (no requirements, or some requirement is unmet).

    Every condition is evaluated (no short-circuit) so that a type error surfaces regardless of
    the order the conditions were written in; requirements only matter once the rule applies.
    """
    holds = [condition_holds(c, facts) for c in rule.conditions]  # a list: each one runs
    if not all(holds):
        return False
    if not rule.requirements:
        return True
    met = [condition_holds(r, facts) for r in rule.requirements]
    return not all(met)


def condition_holds(condition: Condition, facts: Mapping[str, Any]) -> bool:
    """Test one fact; a missing (or null) fact never satisfies a condition or requirement."""
    fact = facts.get(condition.field, _MISSING)
    if fact is _MISSING or fact is None:
        return False
    op, value = condition.op, condition.value
    if op in ("in", "not in"):
        assert isinstance(value, tuple)
        found = any(_equal(fact, item) for item in value)
        return found if op == "in" else not found
    assert not isinstance(value, tuple)
    if op == "==":
        return _equal(fact, value)
    if op == "!=":
        return not _equal(fact, value)
    if (_is_number(fact) and _is_number(value)) or (
        isinstance(fact, str) and isinstance(value, str)
    ):
        return _ORDER[op](fact, value)
    raise GuardrailEvalError(
        f"cannot compare {_type_name(fact)} fact '{condition.field}' with "
        f"{_type_name(value)} using '{op}'"
    )


def render_message(template: str, facts: Mapping[str, Any]) -> str:
    """Replace ``{name}`` with the fact's text, ``?`` when missing.

    Plain substitution, never ``str.format``: templates are operator text and facts are caller
    text, and format's attribute/index syntax would let either reach into Python objects.
    """

    def substitute(match: re.Match[str]) -> str:
        fact = facts.get(match.group(1))
        return "?" if fact is None else _fact_text(fact)

    return _PLACEHOLDER.sub(substitute, template)


def _is_number(value: object) -> bool:
    """Ints and floats mix freely; bools are not numbers here (True must not equal 1)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _equal(fact: object, value: Scalar) -> bool:
    """Type-aware equality: mismatched kinds are simply unequal, never an error."""
    if isinstance(fact, bool) or isinstance(value, bool):
        return isinstance(fact, bool) and isinstance(value, bool) and fact == value
    if _is_number(fact) and _is_number(value):
        return fact == value
    if isinstance(fact, str) and isinstance(value, str):
        return fact == value
    return False


def _type_name(value: object) -> str:
    """JSON vocabulary, since facts arrive as JSON and rule authors think in those terms."""
    if isinstance(value, bool):
        return "boolean"
    if _is_number(value):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _fact_text(fact: object) -> str:
    """JSON-like rendering (``true`` not ``True``), cut to ``MAX_RENDERED_FACT`` characters."""
    if isinstance(fact, str):
        text = fact
    elif isinstance(fact, bool):
        text = "true" if fact else "false"
    elif _is_number(fact):
        text = str(fact)
    else:
        text = json.dumps(fact, ensure_ascii=False, default=str)
    if len(text) > MAX_RENDERED_FACT:
        text = text[: MAX_RENDERED_FACT - 1] + "…"
    return text
