"""Rule loading/validation and evaluation semantics of the guardrail engine."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import pytest

from app.guardrails.evaluate import MAX_RENDERED_FACT, evaluate, render_message
from app.guardrails.rule_files import SHIPPED_RULES_DIR, load_rules, rule_dirs
from app.guardrails.rules import (
    Condition,
    Rule,
    RuleFileError,
    RuleSet,
    rule_set_version,
)
from app.guardrails.service import hits

VALID_RULE = """\
guardrails:
  - id: sample-rule
    description: A sample
    action: block
    conditions:
      - {field: stakes, op: in, value: [high, critical]}
    message: "{stakes} stakes"
"""


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def make_rule(
    rule_id: str = "r",
    *,
    action: str = "block",
    conditions: tuple[tuple[str, str, Any], ...] = (),
    requirements: tuple[tuple[str, str, Any], ...] = (),
    scope: tuple[str, ...] = (),
    message: str = "fired",
    suggestion: str | None = None,
) -> Rule:
    def cond(spec: tuple[str, str, Any]) -> Condition:
        field, op, value = spec
        return Condition(field, op, tuple(value) if isinstance(value, list) else value)

    return Rule(
        id=rule_id,
        description=f"rule {rule_id}",
        action=action,  # type: ignore[arg-type]  # tests pass any action, valid or not
        scope=scope,
        conditions=tuple(map(cond, conditions)),
        requirements=tuple(map(cond, requirements)),
        message=message,
        suggestion=suggestion,
    )


def rule_set(*rules: Rule) -> RuleSet:
    return RuleSet(rules=rules, version=rule_set_version(rules))


def fires(rule: Rule, facts: Mapping[str, Any]) -> bool:
    result = evaluate(rule_set(rule), facts, None)
    assert result.errors == 0
    return result.results[0].fired


# --- loading ---------------------------------------------------------------------------------


def test_valid_file_loads(tmp_path: Path) -> None:
    path = write(tmp_path, "a.yaml", VALID_RULE)
    loaded = load_rules([tmp_path])
    (rule,) = loaded.rules
    assert rule.id == "sample-rule" and rule.action == "block" and rule.scope == ()
    assert rule.conditions == (Condition("stakes", "in", ("high", "critical")),)
    assert rule.requirements == () and rule.suggestion is None
    assert rule.source == str(path)
    assert len(loaded.version) == 16 and int(loaded.version, 16) >= 0


RULE_HEAD = """\
guardrails:
  - id: bad-rule
    description: d
    action: block
    message: m
"""

LOAD_ERRORS = [
    # (file text, line, expected fragment)
    ("guardrails:\n  - id: a\n\tdescription: x\n", 3, "YAML syntax error"),
    ("- just\n- a list\n", 1, "the top level must be a mapping"),
    ("", 1, "file is empty"),
    ("guardrails: {}\n", 1, "'guardrails' must be a list"),
    ("rules: []\n", 1, "unknown key 'rules'"),
    ("guardrails:\n  - not-a-mapping\n", 2, "rule must be a mapping"),
    (RULE_HEAD + "    severity: high\n", 6, "unknown key 'severity' in rule"),
    (
        RULE_HEAD + "    conditions:\n      - {field: x, op: '==', value: 1, note: y}\n",
        7,
        "unknown key 'note' in condition",
    ),
    (
        RULE_HEAD + "    conditions:\n      - {field: x, op: '=='}\n",
        7,
        "condition is missing required key 'value'",
    ),
    (
        RULE_HEAD + "    conditions:\n      - {field: x, value: 1}\n",
        7,
        "condition needs exactly one of 'operator' or 'op'",
    ),
    (
        RULE_HEAD + "    conditions:\n      - {field: x, op: '==', operator: '==', value: 1}\n",
        7,
        "condition needs exactly one of 'operator' or 'op'",
    ),
    (
        "guardrails:\n  - id: ok\n    action: block\n    message: m\n",
        2,
        "rule is missing required key 'description'",
    ),
    (
        "guardrails:\n  - id: ok\n    description: d\n    action: deny\n    message: m\n",
        4,
        "unknown action 'deny' (expected block, warn or escalate)",
    ),
    (
        "guardrails:\n  - id: ok\n    description: d\n    action: escalate\n"
        "    timeout: 366d\n    message: m\n",
        5,
        "invalid timeout '366d' (expected <n>s, <n>m, <n>h or <n>d up to 365d, e.g. 30m)",
    ),
    (
        "guardrails:\n  - id: ok\n    description: d\n    action: escalate\n"
        "    timeout: soon\n    message: m\n",
        5,
        "invalid timeout 'soon'",
    ),
    (
        "guardrails:\n  - id: ok\n    description: d\n    action: block\n"
        "    timeout: 1h\n    message: m\n",
        5,
        "only an escalate rule has a timeout",
    ),
    (
        RULE_HEAD + "    conditions:\n      - field: x\n        op: '=~'\n        value: 1\n",
        8,
        "unknown operator '=~' (expected one of ==, !=, <, <=, >, >=, in, not in)",
    ),
    (
        RULE_HEAD + "    requirements:\n      - {field: x, op: in, value: high}\n",
        7,
        "operator 'in' needs a list value",
    ),
    (
        RULE_HEAD + "    conditions:\n      - {field: x, op: not in, value: 3}\n",
        7,
        "operator 'not in' needs a list value",
    ),
    (
        RULE_HEAD + "    conditions:\n      - {field: x, op: '==', value: [1, 2]}\n",
        7,
        "needs a single value",
    ),
    (
        RULE_HEAD + "    conditions:\n      - {field: x, op: '<', value: true}\n",
        7,
        "needs a number or string value",
    ),
    (
        "guardrails:\n  - id: Bad_Id\n    description: d\n    action: warn\n    message: m\n",
        2,
        "invalid id 'Bad_Id'",
    ),
    (RULE_HEAD + "    scope: payments\n", 6, "scope must be a list"),
    (RULE_HEAD + "    message: again\n", 6, "duplicate key 'message'"),
    (RULE_HEAD + "    suggestion: !!python/object:os.system x\n", 6, "invalid suggestion"),
    (
        RULE_HEAD + "    conditions:\n      - {field: x, op: '==', value: 2024-01-01}\n",
        7,
        "value must be a string, number or boolean",
    ),
    (
        "guardrails:\n  - id: ok\n    description: '  '\n    action: warn\n    message: m\n",
        3,
        "description must be a non-empty string",
    ),
]


@pytest.mark.parametrize(("text", "line", "fragment"), LOAD_ERRORS)
def test_load_errors_name_file_and_line(
    tmp_path: Path, text: str, line: int, fragment: str
) -> None:
    path = tmp_path / "prod.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RuleFileError) as info:
        load_rules([tmp_path])
    assert str(info.value).startswith(f"{path}:{line}: ")
    assert fragment in str(info.value)
    assert info.value.line == line and info.value.path == str(path)


def test_unknown_operator_message_format(tmp_path: Path) -> None:
    text = RULE_HEAD + "    conditions:\n      - {field: x, op: '=~', value: 1}\n"
    path = write(tmp_path / "rules", "prod.yaml", text)
    with pytest.raises(RuleFileError) as info:
        load_rules([tmp_path / "rules"])
    assert str(info.value) == (
        f"{path}:7: unknown operator '=~' (expected one of ==, !=, <, <=, >, >=, in, not in)"
    )


def test_duplicate_id_in_one_file_names_both_places(tmp_path: Path) -> None:
    path = write(tmp_path, "a.yaml", VALID_RULE + VALID_RULE.split("\n", 1)[1])
    with pytest.raises(RuleFileError) as info:
        load_rules([tmp_path])
    assert str(info.value).startswith(f"{path}:8: duplicate guardrail id 'sample-rule'")
    assert f"{path}:2" in str(info.value)


def test_duplicate_id_across_dirs_is_refused(tmp_path: Path) -> None:
    first = write(tmp_path / "shipped", "a.yaml", VALID_RULE)
    second = write(tmp_path / "extra", "b.yml", VALID_RULE)
    with pytest.raises(RuleFileError) as info:
        load_rules([tmp_path / "shipped", tmp_path / "extra"])
    message = str(info.value)
    assert message.startswith(f"{second}:2: duplicate guardrail id 'sample-rule'")
    assert f"{first}:2" in message


def test_missing_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RuleFileError, match="not a readable guardrails directory"):
        load_rules([tmp_path / "nope"])


def test_extra_dir_adds_rules_after_shipped_ones(tmp_path: Path) -> None:
    write(tmp_path, "b.yml", VALID_RULE.replace("sample-rule", "second"))
    write(tmp_path, "a.yaml", VALID_RULE.replace("sample-rule", "first"))
    write(tmp_path, ".hidden.yaml", "not: [valid")
    write(tmp_path, "notes.txt", "ignored")
    shipped = load_rules([SHIPPED_RULES_DIR])
    combined = load_rules(rule_dirs(tmp_path))
    assert combined.rules[: len(shipped.rules)] == shipped.rules
    assert [r.id for r in combined.rules[len(shipped.rules) :]] == ["first", "second"]
    assert combined.version != shipped.version
    assert rule_dirs(None) == [SHIPPED_RULES_DIR]


def test_version_is_stable_and_content_based(tmp_path: Path) -> None:
    write(tmp_path / "one", "a.yaml", VALID_RULE)
    write(tmp_path / "two", "renamed.yml", "# a comment\n" + VALID_RULE)
    v1 = load_rules([tmp_path / "one"]).version
    assert load_rules([tmp_path / "one"]).version == v1
    assert load_rules([tmp_path / "two"]).version == v1  # paths and comments do not count
    write(tmp_path / "one", "a.yaml", VALID_RULE.replace('"{stakes} stakes"', "changed"))
    assert load_rules([tmp_path / "one"]).version != v1
    write(tmp_path / "one", "a.yaml", VALID_RULE.replace("critical]", "critical, low]"))
    assert load_rules([tmp_path / "one"]).version != v1


def test_null_optional_keys_count_as_absent(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", RULE_HEAD + "    scope:\n    conditions: null\n    suggestion:\n")
    (rule,) = load_rules([tmp_path]).rules
    assert rule.scope == () and rule.conditions == () and rule.suggestion is None


def test_as_dict_is_public_shape() -> None:
    rule = make_rule(
        "x", conditions=(("stakes", "in", ["high"]),), suggestion="s", scope=("payments",)
    )
    assert rule.as_dict() == {
        "id": "x",
        "description": "rule x",
        "action": "block",
        "mode": "enforce",
        "scope": ["payments"],
        "conditions": [{"field": "stakes", "operator": "in", "value": ["high"], "op": "in"}],
        "requirements": [],
        "suggestion": "s",
    }
    assert "suggestion" not in make_rule("y").as_dict()


def test_a_condition_may_spell_its_operator_as_listGuardrails_shows_it(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(
        RULE_HEAD + "    conditions:\n      - {field: stakes, operator: in, value: [high]}\n"
    )
    (rule,) = load_rules([tmp_path]).rules
    assert rule.as_dict()["conditions"] == [
        {"field": "stakes", "operator": "in", "value": ["high"], "op": "in"}
    ]


# --- operator semantics ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "value", "fact", "expected"),
    [
        ("==", "high", "high", True),
        ("==", "high", "low", False),
        ("==", 1, 1.0, True),
        ("==", True, True, True),
        ("==", True, False, False),
        ("==", True, 1, False),  # bool never equals a number
        ("==", 1, True, False),
        ("==", 42, "42", False),  # different kinds are unequal, not an error
        ("!=", "high", "low", True),
        ("!=", "high", "high", False),
        ("!=", True, 1, True),
        ("<", 0.5, 0.49, True),
        ("<", 0.5, 0.5, False),
        ("<=", 0.5, 0.5, True),
        (">", 3, 3.5, True),
        (">", 3, 3, False),
        (">=", 3, 3, True),
        ("<", "m", "a", True),
        ("in", ["high", "critical"], "critical", True),
        ("in", ["high", "critical"], "low", False),
        ("in", [1, 2], True, False),
        ("in", [1, 2], 2.0, True),
        ("not in", ["high", "critical"], "low", True),
        ("not in", ["high", "critical"], "high", False),
    ],
)
def test_operator_semantics(op: str, value: Any, fact: Any, expected: bool) -> None:
    assert fires(make_rule(conditions=(("f", op, value),)), {"f": fact}) is expected


@pytest.mark.parametrize("op", ["==", "!=", "<", "in", "not in"])
@pytest.mark.parametrize("facts", [{}, {"f": None}])
def test_missing_fact_makes_condition_false(op: str, facts: dict[str, Any]) -> None:
    value: Any = ["a"] if op in ("in", "not in") else 1
    assert fires(make_rule(conditions=(("f", op, value),)), facts) is False


def test_requirements_clear_the_rule_only_when_all_met() -> None:
    rule = make_rule(
        conditions=(("prod", "==", True),),
        requirements=(("review", "==", True), ("tests", "==", True)),
    )
    assert fires(rule, {"prod": True}) is True  # missing requirement = unmet
    assert fires(rule, {"prod": True, "review": True}) is True
    assert fires(rule, {"prod": True, "review": True, "tests": True}) is False
    assert fires(rule, {"prod": False}) is False
    assert fires(make_rule(), {}) is True  # no conditions, no requirements: always fires


def test_scope_limits_where_rules_apply() -> None:
    rules = rule_set(make_rule("everywhere"), make_rule("payments-only", scope=("payments",)))
    assert evaluate(rules, {}, None).evaluated == 1
    assert evaluate(rules, {}, "auth").evaluated == 1
    result = evaluate(rules, {}, "payments")
    assert result.evaluated == 2
    assert [v.guardrail_id for v in result.violations] == ["everywhere", "payments-only"]


def test_verdict_shape_and_result_order() -> None:
    rules = rule_set(
        make_rule("w", action="warn", message="warn {stakes}", suggestion="do x"),
        make_rule("quiet", conditions=(("stakes", "==", "low"),)),
        make_rule("b", message="blocked", conditions=(("stakes", "==", "high"),)),
    )
    result = evaluate(rules, {"stakes": "high"}, None)
    assert result.allowed is False and result.errors == 0 and result.failed is False
    assert [(r.guardrail_id, r.fired) for r in result.results] == [
        ("w", True),
        ("quiet", False),
        ("b", True),
    ]
    (warning,) = result.warnings
    assert (warning.name, warning.message, warning.severity, warning.suggestion) == (
        "rule w",
        "warn high",
        "warn",
        "do x",
    )
    assert msgspec.to_builtins(hits([warning])) == [
        {
            "guardrailId": "w",
            "name": "rule w",
            "message": "warn high",
            "severity": "warn",
            "suggestion": "do x",
        }
    ]
    assert [v.guardrail_id for v in result.violations] == ["b"]
    assert result.version == rules.version
    assert evaluate(rules, {"stakes": "medium"}, None).allowed is True


# --- failures --------------------------------------------------------------------------------


def test_block_rule_fails_closed_on_type_mismatch() -> None:
    rules = rule_set(
        make_rule("conf", conditions=(("confidence", "<", 0.5),)),
        make_rule("ok", action="warn", conditions=(("x", "==", 1),)),
    )
    result = evaluate(rules, {"confidence": "very"}, None)
    assert result.allowed is False and result.errors == 1 and result.failed is False
    (violation,) = result.violations
    assert violation.message == "Guardrail 'conf' could not be evaluated"
    assert violation.error and "string" in violation.error and "confidence" in violation.error
    assert result.results[0].error == violation.error and result.results[0].fired is False


def test_bool_fact_with_ordering_is_a_type_error() -> None:
    result = evaluate(rule_set(make_rule(conditions=(("n", ">", 0),))), {"n": True}, None)
    assert result.errors == 1 and result.allowed is False


def test_type_error_surfaces_whatever_the_condition_order() -> None:
    rule = make_rule(conditions=(("stakes", "==", "high"), ("confidence", "<", 0.5)))
    assert evaluate(rule_set(rule), {"stakes": "low", "confidence": [1]}, None).errors == 1


def test_warn_rule_failure_is_reported_as_warning() -> None:
    rules = rule_set(
        make_rule("w", action="warn", conditions=(("n", "<", 1),)),
        make_rule("fine", conditions=(("n", "==", "x"),)),
    )
    result = evaluate(rules, {"n": "text"}, None)
    assert result.allowed is True and result.errors == 1 and result.failed is False
    (warning,) = result.warnings
    assert warning.message == "Guardrail 'w' could not be evaluated" and warning.error


def test_failed_when_every_applicable_rule_errors() -> None:
    rules = rule_set(
        make_rule("a", conditions=(("n", "<", 1),)),
        make_rule("b", action="warn", conditions=(("n", ">=", 1),)),
        make_rule("elsewhere", scope=("other",)),
    )
    result = evaluate(rules, {"n": {"nested": 1}}, None)
    assert result.failed is True and result.errors == 2 and result.evaluated == 2
    assert result.allowed is False
    empty = evaluate(rule_set(), {}, None)
    assert empty.failed is False and empty.allowed is True and empty.evaluated == 0


# --- message rendering -----------------------------------------------------------------------


def test_render_message_substitutes_plainly() -> None:
    facts = {"stakes": "high", "confidence": 0.4, "flag": True, "pr": 42, "list": [1, "a"]}
    assert render_message("{stakes}/{confidence}/{flag}/{pr}/{list}/{nope}", facts) == (
        'high/0.4/true/42/[1, "a"]/?'
    )
    assert render_message("{0.__class__} {stakes.__class__} {}", facts) == "? ? {}"
    assert render_message("{a}", {"a": "{stakes} \\1"}) == "{stakes} \\1"  # no re-expansion
    rendered = render_message("{d}", {"d": "x" * 1000})
    assert len(rendered) == MAX_RENDERED_FACT and rendered.endswith("…")
