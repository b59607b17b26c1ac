"""Shadow rules and the stored content of a rule set (no database)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from app.guardrails.evaluate import evaluate
from app.guardrails.rule_files import SHIPPED_RULES_DIR, load_rules
from app.guardrails.rules import (
    RuleFileError,
    RuleSet,
    rule_set_from_content,
)

SHADOW = """\
guardrails:
  - id: watch-fridays
    description: Friday deploys
    action: block
    mode: shadow
    conditions:
      - {field: weekday, op: "==", value: friday}
    message: "a {weekday} deploy"
  - id: watch-sizes
    description: Big batches
    action: warn
    mode: shadow
    conditions:
      - {field: size, op: ">", value: 100}
    message: "{size} items"
  - id: enforced
    description: Enforced
    action: block
    conditions:
      - {field: stakes, op: "==", value: critical}
    message: blocked
"""


def load(tmp_path: Path, text: str) -> RuleSet:
    (tmp_path / "r.yaml").write_text(textwrap.dedent(text), encoding="utf-8")
    return load_rules([tmp_path])


def test_the_shipped_rule_set_keeps_its_version() -> None:
    """Modes count in the version only when a rule is shadow: rule sets without one keep the
    version they had before modes existed (stored evaluations name it)."""
    assert load_rules([SHIPPED_RULES_DIR]).version == "63a948f13ba9c443"


def test_a_shadow_rule_is_evaluated_and_recorded_but_never_decides(tmp_path: Path) -> None:
    rules = load(tmp_path, SHADOW)
    result = evaluate(rules, {"weekday": "friday", "size": "many", "stakes": "low"}, None)
    assert result.allowed and not result.violations and not result.warnings
    assert result.evaluated == 1 and result.errors == 0 and not result.failed
    by_id = {c.guardrail_id: c for c in result.results}
    friday, sizes, enforced = by_id["watch-fridays"], by_id["watch-sizes"], by_id["enforced"]
    assert (friday.mode, friday.fired, friday.would, friday.message) == (
        "shadow",
        False,
        True,
        "a friday deploy",
    )
    assert (sizes.mode, sizes.would, sizes.error is not None) == ("shadow", True, True)
    assert (enforced.mode, enforced.fired, enforced.would) == ("enforce", False, False)
    blocked = evaluate(rules, {"stakes": "critical"}, None)
    assert not blocked.allowed and [v.guardrail_id for v in blocked.violations] == ["enforced"]


def test_only_shadow_rules_that_fail_do_not_fail_the_evaluation(tmp_path: Path) -> None:
    rules = load(tmp_path, SHADOW.split("  - id: enforced")[0])
    result = evaluate(rules, {"size": "many"}, None)
    assert result.allowed and result.evaluated == 0 and not result.failed


def test_an_unknown_mode_names_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(RuleFileError, match=r"r\.yaml:5: unknown mode 'watch'"):
        load(tmp_path, SHADOW.replace("mode: shadow", "mode: watch", 1))


def test_a_rule_set_is_rebuilt_from_its_content(tmp_path: Path) -> None:
    rules = load(tmp_path, SHADOW)
    again = rule_set_from_content(rules.content)
    assert again.hash == rules.hash and again.version == rules.version
    assert [(r.id, r.mode) for r in again.rules] == [
        ("watch-fridays", "shadow"),
        ("watch-sizes", "shadow"),
        ("enforced", "enforce"),
    ]
    content = json.loads(rules.content)
    assert content["format"] == 1 and content["rules"][0]["message"] == "a {weekday} deploy"
    shipped = load_rules([SHIPPED_RULES_DIR])
    assert shipped.hash != rules.hash
    assert rule_set_from_content(shipped.content).hash == shipped.hash
    with pytest.raises(ValueError, match="not a rule set"):
        rule_set_from_content('{"format": 1, "rules": [{"id": "x"}]}')
