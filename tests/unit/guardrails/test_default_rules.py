"""The shipped default rules: each one fires and clears as intended, and the F004 seed agrees."""

from __future__ import annotations

from typing import Any

import pytest

from app.guardrails.evaluate import Evaluation, evaluate
from app.guardrails.rule_files import SHIPPED_RULES_DIR, load_rules
from app.guardrails.rules import RuleSet

DEFAULT_IDS = [
    "no-high-stakes-low-confidence",
    "production-needs-code-review",
    "prefer-staged-rollout",
    "security-changes-need-review",
    "critical-needs-high-confidence",
]

# A low-risk baseline that fires nothing; each test changes only what its rule looks at.
BASE: dict[str, Any] = {
    "description": "Refactor the logging helper",
    "category": "tooling",
    "stakes": "medium",
    "confidence": 0.9,
}

SEED_FACTS: dict[str, Any] = {
    "description": "Deploy authentication service to production",
    "category": "architecture",
    "stakes": "high",
    "confidence": 0.85,
    "pr_number": 42,
    "branch": "feat/auth-v2",
    "commit": "abc123",
}


@pytest.fixture(scope="module")
def rules() -> RuleSet:
    return load_rules([SHIPPED_RULES_DIR])


def check(rules: RuleSet, **changes: Any) -> Evaluation:
    result = evaluate(rules, {**BASE, **changes}, None)
    assert result.errors == 0
    return result


def fired(result: Evaluation) -> list[str]:
    return [r.guardrail_id for r in result.violations + result.warnings]


def test_shipped_rules_are_the_documented_five(rules: RuleSet) -> None:
    assert (SHIPPED_RULES_DIR / "default.yaml").is_file()
    assert [r.id for r in rules.rules] == DEFAULT_IDS
    assert all(r.suggestion for r in rules.rules)
    assert check(rules).allowed and fired(check(rules)) == []


def test_high_stakes_low_confidence_fires(rules: RuleSet) -> None:
    result = check(rules, stakes="high", confidence=0.3, staged_rollout=True)
    assert not result.allowed
    (violation,) = result.violations
    assert violation.guardrail_id == "no-high-stakes-low-confidence"
    assert violation.message == "high stakes with confidence 0.3 is below the 0.5 minimum"


def test_high_stakes_low_confidence_clears_at_threshold(rules: RuleSet) -> None:
    result = check(rules, stakes="high", confidence=0.5, staged_rollout=True)
    assert result.allowed and fired(result) == []


def test_production_needs_code_review_fires(rules: RuleSet) -> None:
    result = check(rules, affects_production=True)
    assert not result.allowed
    (violation,) = result.violations
    assert violation.guardrail_id == "production-needs-code-review"
    assert violation.suggestion and "review" in violation.suggestion.lower()


def test_production_needs_code_review_clears_with_review(rules: RuleSet) -> None:
    result = check(rules, affects_production=True, code_review=True)
    assert result.allowed and fired(result) == []


def test_prefer_staged_rollout_fires(rules: RuleSet) -> None:
    result = check(rules, stakes="critical", confidence=0.95)
    assert result.allowed and fired(result) == ["prefer-staged-rollout"]


def test_prefer_staged_rollout_clears_when_staged(rules: RuleSet) -> None:
    result = check(rules, stakes="high", staged_rollout=True)
    assert result.allowed and fired(result) == []


def test_security_changes_need_review_fires(rules: RuleSet) -> None:
    result = check(rules, category="security")
    assert result.allowed and fired(result) == ["security-changes-need-review"]


def test_security_changes_need_review_clears_with_review(rules: RuleSet) -> None:
    result = check(rules, category="security", security_review=True)
    assert result.allowed and fired(result) == []


def test_critical_needs_high_confidence_fires(rules: RuleSet) -> None:
    result = check(rules, stakes="critical", confidence=0.6, staged_rollout=True)
    assert result.allowed and fired(result) == ["critical-needs-high-confidence"]
    assert "0.6" in result.warnings[0].message


def test_critical_needs_high_confidence_clears_at_threshold(rules: RuleSet) -> None:
    result = check(rules, stakes="critical", confidence=0.7, staged_rollout=True)
    assert result.allowed and fired(result) == []


def test_seed_request_is_allowed_with_one_staged_rollout_warning(rules: RuleSet) -> None:
    result = evaluate(rules, SEED_FACTS, None)
    assert result.allowed is True
    assert result.violations == ()
    (warning,) = result.warnings
    assert warning.guardrail_id == "prefer-staged-rollout"
    assert warning.severity == "warn"
    assert warning.suggestion and "staged rollout" in warning.suggestion.lower()
    assert "staged rollout" in warning.message.lower()
    assert result.evaluated == len([r for r in rules.rules if not r.scope]) == 5
    assert result.errors == 0 and result.failed is False
