"""cstp.checkGuardrails and cstp.listGuardrails over the real RPC: the shipped rules, operator
rules from CSTP_GUARDRAILS_DIR, stored (append-only) evaluations, and the SQL cookbook of
docs/GUARDRAILS.md run on the test database."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import bindparam, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine

from app.asgi import create_app
from app.config import Settings
from app.db.base import UtcDateTime
from app.runtime import Runtime, iso
from support.app import Rpc, serve_app, settings_in
from support.databases import copy_database, run_sql

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "GUARDRAILS.md"
DEFAULT_RULES = yaml.safe_load(
    (ROOT / "app" / "guardrails" / "rules" / "default.yaml").read_text(encoding="utf-8")
)["guardrails"]
DEFAULT_IDS = [rule["id"] for rule in DEFAULT_RULES]
SEVERITY = {rule["id"]: rule["action"] for rule in DEFAULT_RULES}

BASE: dict[str, Any] = {
    "description": "Refactor the job scheduler",
    "category": "architecture",
    "stakes": "medium",
    "confidence": 0.9,
}


class Clock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


def action(**changes: Any) -> dict[str, Any]:
    return {**BASE, **changes}


async def check(rpc: Rpc, act: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    result: dict[str, Any] = await rpc.ok("cstp.checkGuardrails", {"action": act}, token=token)
    return result


def fired(result: dict[str, Any]) -> tuple[set[str], set[str]]:
    """(ids of violations, ids of warnings), checking each item's severity on the way."""
    for item in result["violations"]:
        assert item["severity"] == "block", item
    for item in result["warnings"]:
        assert item["severity"] == "warn", item
    return (
        {v["guardrailId"] for v in result["violations"]},
        {w["guardrailId"] for w in result["warnings"]},
    )


async def sql(settings: Settings, statement: str, **params: Any) -> list[dict[str, Any]]:
    """Run one statement on the test database in its own connection (what an auditor does)."""
    return await run_sql(settings.database_url, statement, **params)


async def sql_count(rpc: Rpc, table: str) -> int:
    services = rpc.client.app.state.services
    async with services.db.transaction(write=False) as session:
        return int((await session.execute(text(f"SELECT COUNT(*) FROM {table}"))).scalar_one())


@pytest.fixture
def default_rules_match_the_doc_assumptions() -> None:
    assert DEFAULT_IDS == [
        "no-high-stakes-low-confidence",
        "production-needs-code-review",
        "prefer-staged-rollout",
        "security-changes-need-review",
        "critical-needs-high-confidence",
    ]


# ---------------------------------------------------------------------------------------------
# The shipped rules: each one fires, and each one clears
# ---------------------------------------------------------------------------------------------

STAGED = {"staged_rollout": True}  # keeps prefer-staged-rollout quiet when stakes are high

RULE_CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    # (rule, an action that fires it alone, a close action that clears it)
    (
        "no-high-stakes-low-confidence",
        action(stakes="high", confidence=0.3, context=STAGED),
        action(stakes="high", confidence=0.5, context=STAGED),
    ),
    (
        "no-high-stakes-low-confidence",
        action(stakes="high", confidence=0.0, context=STAGED),
        action(stakes="low", confidence=0.0),
    ),
    (
        "production-needs-code-review",
        action(context={"affects_production": True}),
        action(context={"affects_production": True, "code_review": True}),
    ),
    (
        "production-needs-code-review",
        action(context={"affects_production": True, "code_review": False}),
        action(context={"affects_production": False}),
    ),
    ("prefer-staged-rollout", action(stakes="high"), action(stakes="high", context=STAGED)),
    ("prefer-staged-rollout", action(stakes="critical", confidence=0.95), action(stakes="medium")),
    (
        "security-changes-need-review",
        action(category="security"),
        action(category="security", context={"security_review": True}),
    ),
    (
        "critical-needs-high-confidence",
        action(stakes="critical", confidence=0.6, context=STAGED),
        action(stakes="critical", confidence=0.7, context=STAGED),
    ),
]


@pytest.mark.usefixtures("default_rules_match_the_doc_assumptions")
@pytest.mark.parametrize(
    ("rule_id", "firing", "clearing"),
    RULE_CASES,
    ids=[f"{c[0]}-{i}" for i, c in enumerate(RULE_CASES)],
)
async def test_each_default_rule_fires_and_clears(
    shared_rpc: Rpc, rule_id: str, firing: dict[str, Any], clearing: dict[str, Any]
) -> None:
    result = await check(shared_rpc, firing)
    violations, warnings = fired(result)
    expected_block = {rule_id} if SEVERITY[rule_id] == "block" else set()
    expected_warn = {rule_id} if SEVERITY[rule_id] == "warn" else set()
    assert (violations, warnings) == (expected_block, expected_warn), result
    assert result["allowed"] is (SEVERITY[rule_id] == "warn")
    assert result["evaluated"] == 5
    item = (result["violations"] + result["warnings"])[0]
    rule = next(r for r in DEFAULT_RULES if r["id"] == rule_id)
    assert item["name"] == rule["description"]
    assert item["suggestion"] == rule["suggestion"]
    assert item["message"] and "{" not in item["message"]

    cleared = await check(shared_rpc, clearing)
    assert cleared["violations"] == [] and cleared["warnings"] == [], cleared
    assert cleared["allowed"] is True
    assert cleared["evaluated"] == 5


async def test_messages_show_the_request_facts(shared_rpc: Rpc) -> None:
    result = await check(shared_rpc, action(stakes="critical", confidence=0.25, context=STAGED))
    by_id = {i["guardrailId"]: i for i in result["violations"] + result["warnings"]}
    assert set(by_id) == {"no-high-stakes-low-confidence", "critical-needs-high-confidence"}
    assert "critical" in by_id["no-high-stakes-low-confidence"]["message"]
    assert "0.25" in by_id["no-high-stakes-low-confidence"]["message"]
    assert "0.25" in by_id["critical-needs-high-confidence"]["message"]


@pytest.mark.parametrize(
    ("act", "blocks", "warns"),
    [
        (
            action(
                stakes="critical",
                confidence=0.2,
                category="security",
                context={"affects_production": True},
            ),
            {"no-high-stakes-low-confidence", "production-needs-code-review"},
            {
                "prefer-staged-rollout",
                "security-changes-need-review",
                "critical-needs-high-confidence",
            },
        ),
        (
            action(stakes="critical", confidence=0.6, category="security"),
            set(),
            {
                "prefer-staged-rollout",
                "security-changes-need-review",
                "critical-needs-high-confidence",
            },
        ),
        (
            action(stakes="high", confidence=0.4),
            {"no-high-stakes-low-confidence"},
            {"prefer-staged-rollout"},
        ),
        (
            action(
                context={"affects_production": True, "code_review": True, "staged_rollout": False}
            ),
            set(),
            set(),
        ),
        ({"description": "Only a description"}, set(), set()),
    ],
)
async def test_allowed_is_false_exactly_when_a_block_rule_fired(
    shared_rpc: Rpc, act: dict[str, Any], blocks: set[str], warns: set[str]
) -> None:
    result = await check(shared_rpc, act)
    assert fired(result) == (blocks, warns), result
    assert result["allowed"] is (not blocks)
    assert result["evaluated"] == 5


async def test_seed_f004_example(shared_rpc: Rpc) -> None:
    result = await check(
        shared_rpc,
        {
            "description": "Deploy authentication service to production",
            "category": "architecture",
            "stakes": "high",
            "confidence": 0.85,
            "context": {"pr_number": 42, "branch": "feat/auth-v2", "commit": "abc123"},
        },
    )
    assert result["allowed"] is True
    assert result["violations"] == []
    assert [w["guardrailId"] for w in result["warnings"]] == ["prefer-staged-rollout"]
    warning = result["warnings"][0]
    assert warning["severity"] == "warn"
    assert "staged rollout" in warning["suggestion"].lower()
    assert result["evaluated"] == 5
    assert result["agent"] == "alice"
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|\+00:00)", result["evaluatedAt"]
    ), result["evaluatedAt"]


@pytest.mark.parametrize(
    ("act", "blocks", "warns"),
    [
        (
            action(stakes="high", confidence=0.3, context={"stakes": "low", "confidence": 0.99}),
            {"no-high-stakes-low-confidence"},
            {"prefer-staged-rollout"},
        ),
        (action(category="architecture", context={"category": "security"}), set(), set()),
        (
            action(
                category="security", context={"category": "architecture", "security_review": False}
            ),
            set(),
            {"security-changes-need-review"},
        ),
        (
            action(stakes="low", context={"stakes": "critical", "affects_production": False}),
            set(),
            set(),
        ),
        (
            action(
                stakes="critical",
                confidence=0.65,
                context={"confidence": 0.9, "staged_rollout": True},
            ),
            set(),
            {"critical-needs-high-confidence"},
        ),
    ],
    ids=["stakes+confidence", "category-up", "category-down", "stakes-up", "confidence-up"],
)
async def test_core_fields_cannot_be_overridden_from_context(
    shared_rpc: Rpc, act: dict[str, Any], blocks: set[str], warns: set[str]
) -> None:
    result = await check(shared_rpc, act)
    assert fired(result) == (blocks, warns), result
    assert result["allowed"] is (not blocks)


@pytest.mark.parametrize(
    ("act", "field"),
    [
        ({"category": "architecture"}, "action.description"),
        ({"description": "   "}, "action.description"),
        ({"description": "x", "stakes": "huge"}, "action.stakes"),
        ({"description": "x", "confidence": 1.5}, "action.confidence"),
        ({"description": "x", "confidence": "high"}, "action.confidence"),
        ({"description": "x", "context": ["not", "an", "object"]}, "action.context"),
    ],
)
async def test_bad_action_is_invalid_params(
    shared_rpc: Rpc, act: dict[str, Any], field: str
) -> None:
    error = await shared_rpc.error("cstp.checkGuardrails", {"action": act})
    assert error["code"] == -32602, error
    assert error["data"]["field"] == field, error


async def test_missing_action_is_invalid_params(shared_rpc: Rpc) -> None:
    error = await shared_rpc.error("cstp.checkGuardrails", {})
    assert error["code"] == -32602
    assert error["data"]["field"] == "action"


async def test_unknown_category_is_invalid_params(rpc: Rpc) -> None:
    error = await rpc.error(
        "cstp.checkGuardrails", {"action": {"description": "x", "category": "marketing"}}
    )
    assert error["code"] == -32602
    assert error["data"]["field"].endswith("category")
    assert await sql_count(rpc, "guardrail_evaluations") == 0  # nothing stored for a bad call


async def test_unknown_category_names_the_nested_field(shared_rpc: Rpc) -> None:
    error = await shared_rpc.error(
        "cstp.checkGuardrails", {"action": {"description": "x", "category": "marketing"}}
    )
    assert error["code"] == -32602
    assert error["data"]["field"] == "action.category"


# ---------------------------------------------------------------------------------------------
# Operator rules (CSTP_GUARDRAILS_DIR)
# ---------------------------------------------------------------------------------------------

PAYMENTS_RULES = """\
guardrails:
  - id: payments-needs-pci-review
    description: Payments changes need a PCI review
    action: block
    scope: [payments]
    conditions:
      - {field: stakes, op: in, value: [medium, high, critical]}
    requirements:
      - {field: pci_review, op: "==", value: true}
    message: "{stakes}-stakes payments change without a PCI review"
    suggestion: Ask the PCI team for a review
"""


def write_rules(folder: Path) -> Path:
    directory = folder / "operator-rules"
    directory.mkdir()
    (directory / "payments.yaml").write_text(PAYMENTS_RULES, encoding="utf-8")
    return directory


@pytest.fixture
def rules_dir(tmp_path: Path) -> Path:
    return write_rules(tmp_path)


@pytest.fixture(scope="module")
async def ops_rpc(
    template_db: str, tmp_path_factory: pytest.TempPathFactory, embedder: Any
) -> AsyncIterator[Rpc]:
    """One app with the operator rules for the module: its tests count nothing stored."""
    folder = tmp_path_factory.mktemp("operator-rules-app")
    async with copy_database(template_db, folder) as url:
        settings = replace(settings_in(folder, url), guardrails_dir=write_rules(folder))
        async with serve_app(create_app(settings, embedder=embedder)) as client:
            yield Rpc(client)


@pytest.mark.parametrize(
    ("extra", "applies"),
    [
        ({}, False),
        ({"project": "payments"}, True),
        ({"context": {"project": "payments"}}, True),
        ({"project": "search"}, False),
        ({"context": {"project": "search"}}, False),
        ({"project": "Payments"}, False),
    ],
    ids=[
        "no-project",
        "action.project",
        "context.project",
        "other-project",
        "other-context-project",
        "case-matters",
    ],
)
async def test_scoped_operator_rule_applies_only_to_its_project(
    ops_rpc: Rpc, extra: dict[str, Any], applies: bool
) -> None:
    result = await check(ops_rpc, action(**extra))  # medium stakes, no pci_review
    assert result["evaluated"] == (6 if applies else 5)
    blocks, warns = fired(result)
    assert blocks == ({"payments-needs-pci-review"} if applies else set()), result
    assert warns == set()
    assert result["allowed"] is (not applies)
    if applies:
        violation = result["violations"][0]
        assert violation["message"] == "medium-stakes payments change without a PCI review"
        assert violation["suggestion"] == "Ask the PCI team for a review"


async def test_scoped_operator_rule_clears_with_its_requirement(ops_rpc: Rpc) -> None:
    result = await check(ops_rpc, action(project="payments", context={"pci_review": True}))
    assert result == {**result, "allowed": True, "violations": [], "warnings": [], "evaluated": 6}
    low = await check(ops_rpc, action(project="payments", stakes="low"))
    assert low["allowed"] is True and low["evaluated"] == 6


async def test_operator_rules_do_not_exist_without_the_dir(shared_rpc: Rpc) -> None:
    result = await check(shared_rpc, action(project="payments"))
    assert result["evaluated"] == 5 and result["allowed"] is True


def _as_listed(condition: dict[str, Any]) -> dict[str, Any]:
    """A rule file's ``{field, op, value}`` as listGuardrails shows it: ``{field, operator,
    value}`` as earlier CSTP clients read it, plus the deprecated ``op``."""
    operator = condition.get("operator", condition.get("op"))
    return {
        "field": condition["field"],
        "operator": operator,
        "value": condition["value"],
        "op": operator,
    }


def _check_listed_rule(item: dict[str, Any], rule: dict[str, Any]) -> None:
    assert item["id"] == rule["id"]
    assert item["description"] == rule["description"]
    assert item["action"] == rule["action"]
    assert item["mode"] == rule.get("mode", "enforce")
    assert item["scope"] == rule.get("scope", [])
    assert item["conditions"] == [_as_listed(c) for c in rule.get("conditions", [])]
    assert item["requirements"] == [_as_listed(c) for c in rule.get("requirements", [])]
    assert item.get("suggestion") == rule.get("suggestion")


async def test_list_guardrails_shipped_rules(shared_rpc: Rpc) -> None:
    listed = await shared_rpc.ok("cstp.listGuardrails")
    assert [g["id"] for g in listed["guardrails"]] == DEFAULT_IDS
    assert listed["count"] == 5
    assert listed["agent"] == "alice"
    for item, rule in zip(listed["guardrails"], DEFAULT_RULES, strict=True):
        _check_listed_rule(item, rule)
    scoped = await shared_rpc.ok("cstp.listGuardrails", {"scope": "payments"}, token="token-bob")
    assert [g["id"] for g in scoped["guardrails"]] == DEFAULT_IDS
    assert scoped["agent"] == "bob"


async def test_list_guardrails_with_operator_rules(ops_rpc: Rpc) -> None:
    payments_rule = yaml.safe_load(PAYMENTS_RULES)["guardrails"][0]
    everything = await ops_rpc.ok("cstp.listGuardrails")
    ids = [g["id"] for g in everything["guardrails"]]
    assert sorted(ids) == sorted([*DEFAULT_IDS, "payments-needs-pci-review"])
    assert everything["count"] == 6
    _check_listed_rule(
        next(g for g in everything["guardrails"] if g["id"] == "payments-needs-pci-review"),
        payments_rule,
    )
    for scope, expected in (("payments", 6), ("search", 5)):
        listed = await ops_rpc.ok("cstp.listGuardrails", {"scope": scope})
        wanted = [*DEFAULT_IDS, "payments-needs-pci-review"][:expected]
        assert sorted(g["id"] for g in listed["guardrails"]) == sorted(wanted), scope
        assert listed["count"] == expected
    null_scope = await ops_rpc.ok("cstp.listGuardrails", {"scope": None})
    assert null_scope["count"] == 6  # null counts as absent


RISK_RULES = """\
guardrails:
  - id: risk-score-limit
    description: Risk score must stay below 8
    action: block
    conditions:
      - {field: risk_score, op: ">=", value: 8}
    message: "risk score {risk_score} is too high"
  - id: risk-score-watch
    description: Watch risk scores from 5
    action: warn
    conditions:
      - {field: risk_score, op: ">=", value: 5}
    message: "risk score {risk_score} is worth watching"
"""


async def test_a_rule_that_cannot_be_evaluated_fails_closed(
    settings: Settings, embedder: Any, tmp_path: Path
) -> None:
    directory = tmp_path / "risk-rules"
    directory.mkdir()
    (directory / "risk.yaml").write_text(RISK_RULES, encoding="utf-8")
    app = create_app(replace(settings, guardrails_dir=directory), embedder=embedder)
    async with serve_app(app) as client:
        rpc = Rpc(client)
        high = await check(rpc, action(description="high risk", context={"risk_score": 9}))
        assert fired(high) == ({"risk-score-limit"}, {"risk-score-watch"})
        low = await check(rpc, action(description="low risk", context={"risk_score": 2}))
        assert fired(low) == (set(), set()) and low["allowed"] is True
        # a string where the rule compares numbers: the block rule fails closed
        odd = await check(rpc, action(description="odd risk", context={"risk_score": "high"}))
        assert odd["allowed"] is False, odd
        assert fired(odd) == ({"risk-score-limit"}, {"risk-score-watch"})
        assert odd["evaluated"] == 7
        for item in odd["violations"] + odd["warnings"]:
            assert "Traceback" not in item["message"]
    rows = await sql(
        settings,
        "SELECT e.description, r.guardrail_id, r.fired, r.error "
        "FROM guardrail_evaluations AS e JOIN guardrail_rule_results AS r "
        "ON r.evaluation_id = e.id WHERE r.error IS NOT NULL",
    )
    assert sorted((r["description"], r["guardrail_id"]) for r in rows) == [
        ("odd risk", "risk-score-limit"),
        ("odd risk", "risk-score-watch"),
    ]
    evaluation = (
        await sql(
            settings, "SELECT allowed FROM guardrail_evaluations WHERE description = 'odd risk'"
        )
    )[0]
    assert not evaluation["allowed"]
    query = doc_sql_blocks()["Which rules could not be evaluated?"]
    failed = await run_doc_sql(settings, query, since=datetime(2000, 1, 1, tzinfo=UTC))
    assert sorted(r["guardrail_id"] for r in failed) == ["risk-score-limit", "risk-score-watch"]


BAD_FILES = [
    # (file text, line of the mistake, words the error must contain)
    (
        """\
     guardrails:
       - id: bad-operator
         description: Uses an operator that does not exist
         action: block
         conditions:
           - field: stakes
             op: "~="
             value: high
         message: nope
     """,
        7,
        "operator",
    ),
    (
        """\
     guardrails:
       - id: bad-action
         description: Unknown action
         action: deny
         message: nope
     """,
        4,
        "action",
    ),
    (
        """\
     guardrails:
       - id: missing-message
         description: No message
         action: warn
       - id: second
     """,
        2,
        "message",
    ),
    (
        """\
     guardrails:
       - id: prefer-staged-rollout
         description: Redefines a shipped rule
         action: warn
         message: duplicate
     """,
        2,
        "duplicate",
    ),
    (
        """\
     guardrails:
       - id: broken-yaml
         description: [unclosed
         action: warn
     """,
        4,
        "YAML",
    ),
]


@pytest.mark.parametrize(
    ("body", "line", "word"),
    BAD_FILES,
    ids=["operator", "action", "missing-key", "duplicate-id", "syntax"],
)
async def test_malformed_rule_file_stops_create_app(
    settings: Settings, embedder: Any, tmp_path: Path, body: str, line: int, word: str
) -> None:
    directory = tmp_path / "bad-rules"
    directory.mkdir()
    (directory / "00-good.yaml").write_text(PAYMENTS_RULES, encoding="utf-8")
    bad = directory / "10-team-rules.yaml"
    bad.write_text(textwrap.dedent(body), encoding="utf-8")
    with pytest.raises(Exception) as caught:
        create_app(replace(settings, guardrails_dir=directory), embedder=embedder)
    message = str(caught.value)
    assert "10-team-rules.yaml" in message, message
    assert re.search(rf"(:|line ){line}\b", message), message
    assert word.lower() in message.lower(), message


# ---------------------------------------------------------------------------------------------
# Stored evaluations (append-only)
# ---------------------------------------------------------------------------------------------

STORED_CHECKS: list[tuple[str, dict[str, Any]]] = [
    ("token-alice", action(description="check one: plain")),
    (
        "token-bob",
        action(
            description="check two: blocked",
            stakes="high",
            confidence=0.2,
            context={"affects_production": True, "ticket": "OPS-1"},
        ),
    ),
    (
        "token-alice",
        action(
            description="check three: warned",
            category="security",
            context={"nested": {"a": [1, 2]}, "flag": False},
        ),
    ),
    ("token-bob", action(description="check four: critical", stakes="critical", confidence=0.65)),
    ("token-alice", {"description": "check five: only a description"}),
]


async def _rule_results(settings: Settings, evaluation_id: str) -> dict[str, dict[str, Any]]:
    rows = await sql(
        settings,
        "SELECT guardrail_id, severity, fired, message, error "
        "FROM guardrail_rule_results WHERE evaluation_id = :id",
        id=evaluation_id,
    )
    return {row["guardrail_id"]: row for row in rows}


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


async def test_every_check_is_stored_with_its_rule_results(
    settings: Settings, embedder: Any
) -> None:
    start = datetime(2026, 6, 1, 8, 0, tzinfo=UTC)
    clock = Clock(start)
    app = create_app(settings, runtime=Runtime(now=clock), embedder=embedder)
    answers = []
    async with serve_app(app) as client:
        rpc = Rpc(client)
        version = client.app.state.services.rules.version
        for token, act in STORED_CHECKS:
            clock.now += timedelta(minutes=1)
            answers.append(await check(rpc, act, token=token))

    rows = await sql(settings, "SELECT * FROM guardrail_evaluations ORDER BY evaluated_at")
    assert len(rows) == len(STORED_CHECKS)
    assert len({row["id"] for row in rows}) == len(rows)
    assert len({row["rule_set_version"] for row in rows}) == 1
    agents = {"token-alice": "alice", "token-bob": "bob"}
    for i, (row, (token, act), answer) in enumerate(zip(rows, STORED_CHECKS, answers, strict=True)):
        assert row["agent"] == agents[token]
        assert row["source"] == "checkGuardrails"
        evaluated_at = row["evaluated_at"]
        if isinstance(evaluated_at, str):  # SQLite text, naive UTC
            evaluated_at = datetime.fromisoformat(evaluated_at)
        if evaluated_at.tzinfo is None:
            evaluated_at = evaluated_at.replace(tzinfo=UTC)
        assert evaluated_at == start + timedelta(minutes=i + 1)
        assert answer["evaluatedAt"] in (
            iso(evaluated_at),
            iso(evaluated_at).replace("Z", "+00:00"),
        )
        assert row["description"] == act["description"]
        assert row["category"] == act.get("category")
        assert row["stakes"] == act.get("stakes")
        assert row["confidence"] == act.get("confidence")
        facts = _json(row["facts"])
        for key in ("description", "category", "stakes", "confidence"):
            assert facts.get(key) == act.get(key), (key, facts)
        for key, value in act.get("context", {}).items():
            assert facts[key] == value, (key, facts)
        assert bool(row["allowed"]) is answer["allowed"]
        assert row["evaluated"] == answer["evaluated"] == 5
        assert row["violations"] == len(answer["violations"])
        assert row["warnings"] == len(answer["warnings"])
        assert row["rule_set_version"] == version

        results = await _rule_results(settings, row["id"])
        assert set(results) == set(DEFAULT_IDS), results
        blocks, warns = fired(answer)
        for rule_id, result in results.items():
            assert result["severity"] == SEVERITY[rule_id]
            assert bool(result["fired"]) is (rule_id in blocks | warns), (rule_id, result)
            assert result["error"] is None
            if result["fired"]:
                item = next(
                    x
                    for x in answer["violations"] + answer["warnings"]
                    if x["guardrailId"] == rule_id
                )
                assert result["message"] == item["message"]
    verdicts = [a["allowed"] for a in answers]
    assert True in verdicts and False in verdicts  # the mix the test is about


async def test_stored_rule_results_follow_the_scope(
    settings: Settings, embedder: Any, rules_dir: Path
) -> None:
    app = create_app(replace(settings, guardrails_dir=rules_dir), embedder=embedder)
    async with serve_app(app) as client:
        rpc = Rpc(client)
        version = client.app.state.services.rules.version
        await check(rpc, action(description="in payments", project="payments"))
        await check(rpc, action(description="elsewhere"))
    rows = await sql(
        settings,
        "SELECT id, description, project, evaluated, allowed, "
        "rule_set_version FROM guardrail_evaluations",
    )
    by_description = {row["description"]: row for row in rows}
    payments, elsewhere = by_description["in payments"], by_description["elsewhere"]
    assert payments["project"] == "payments" and payments["evaluated"] == 6
    assert not payments["allowed"]
    assert elsewhere["project"] is None and elsewhere["evaluated"] == 5
    assert payments["rule_set_version"] == elsewhere["rule_set_version"] == version
    in_payments = await _rule_results(settings, payments["id"])
    assert set(in_payments) == {*DEFAULT_IDS, "payments-needs-pci-review"}
    assert [k for k, v in in_payments.items() if v["fired"]] == ["payments-needs-pci-review"]
    assert set(await _rule_results(settings, elsewhere["id"])) == set(DEFAULT_IDS)


async def test_rule_set_version_changes_with_the_rules(
    rpc: Rpc, settings: Settings, embedder: Any, rules_dir: Path
) -> None:
    await check(rpc, action(description="with shipped rules"))
    app = create_app(replace(settings, guardrails_dir=rules_dir), embedder=embedder)
    async with serve_app(app) as client:
        await check(Rpc(client), action(description="with operator rules"))
    rows = await sql(settings, "SELECT description, rule_set_version FROM guardrail_evaluations")
    versions = {row["description"]: row["rule_set_version"] for row in rows}
    assert versions["with shipped rules"] and versions["with operator rules"]
    assert versions["with shipped rules"] != versions["with operator rules"]


CHANGES = [
    "UPDATE guardrail_evaluations SET agent = 'mallory'",
    "UPDATE guardrail_evaluations SET allowed = NOT allowed",
    "DELETE FROM guardrail_evaluations",
    "UPDATE guardrail_rule_results SET fired = NOT fired",
    "UPDATE guardrail_rule_results SET message = 'edited'",
    "DELETE FROM guardrail_rule_results",
]


async def test_the_database_refuses_to_change_stored_evaluations(
    rpc: Rpc, settings: Settings
) -> None:
    await check(rpc, action(stakes="high", confidence=0.1))
    await check(rpc, action(), token="token-bob")
    snapshot_sql = (
        "SELECT e.id, e.agent, e.allowed, r.guardrail_id, r.fired, r.message "
        "FROM guardrail_evaluations AS e JOIN guardrail_rule_results AS r "
        "ON r.evaluation_id = e.id ORDER BY e.id, r.guardrail_id"
    )
    before = await sql(settings, snapshot_sql)
    assert len(before) == 10
    for statement in CHANGES:
        with pytest.raises(DBAPIError):
            await sql(settings, statement)
    assert await sql(settings, snapshot_sql) == before
    # targeted single-row changes are refused too
    one = before[0]["id"]
    with pytest.raises(DBAPIError):
        await sql(settings, "DELETE FROM guardrail_rule_results WHERE evaluation_id = :id", id=one)
    with pytest.raises(DBAPIError):
        await sql(
            settings, "UPDATE guardrail_evaluations SET description = 'x' WHERE id = :id", id=one
        )
    assert await sql(settings, snapshot_sql) == before


# ---------------------------------------------------------------------------------------------
# The SQL cookbook of docs/GUARDRAILS.md, run on this database
# ---------------------------------------------------------------------------------------------

BLOCKED_THIS_WEEK = "Which requests did rule X block this week?"


def doc_sql_blocks() -> dict[str, str]:
    """Each ```sql block of the doc, keyed by the heading it sits under."""
    blocks: dict[str, str] = {}
    heading = ""
    for match in re.finditer(
        r"^(#{1,6}) (?P<h>[^\n]+)$|^```sql\n(?P<sql>.*?)^```",
        DOC.read_text(encoding="utf-8"),
        re.M | re.S,
    ):
        if match.group("h"):
            heading = match.group("h").strip()
        else:
            assert heading not in blocks, f"two sql blocks under {heading!r}"
            blocks[heading] = match.group("sql").strip().rstrip(";")
    return blocks


def statement(sql_text: str) -> Any:
    """The doc's SQL with its timestamps bound as UTC datetimes (as the doc tells auditors)."""
    stmt = text(sql_text)
    typed = [
        bindparam(name, type_=UtcDateTime())
        for name in ("week_start", "since")
        if re.search(rf":{name}\b", sql_text)
    ]
    return stmt.bindparams(*typed) if typed else stmt


async def run_doc_sql(settings: Settings, sql_text: str, **params: Any) -> list[dict[str, Any]]:
    wanted = set(re.findall(r"(?<![:\w]):(\w+)", sql_text))
    engine = create_async_engine(settings.database_url)
    try:
        async with engine.connect() as conn:
            result = await conn.execute(
                statement(sql_text), {k: v for k, v in params.items() if k in wanted}
            )
            return [dict(row._mapping) for row in result]
    finally:
        await engine.dispose()


NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
PRODUCTION = {"affects_production": True}
HISTORY: list[tuple[timedelta, str, dict[str, Any]]] = [
    # (how long before NOW, token, action)
    (
        timedelta(days=10),
        "token-alice",
        action(description="old: prod change without review", context=PRODUCTION),
    ),
    (
        timedelta(days=7, seconds=1),
        "token-bob",
        action(description="just over a week ago: prod change without review", context=PRODUCTION),
    ),
    (
        timedelta(days=6),
        "token-alice",
        action(description="A: prod change without review", context=PRODUCTION),
    ),
    (
        timedelta(days=5),
        "token-bob",
        action(
            description="B: risky but reviewed",
            stakes="high",
            confidence=0.2,
            context={"affects_production": True, "code_review": True, **STAGED},
        ),
    ),
    (
        timedelta(days=3),
        "token-bob",
        action(
            description="C: prod and risky", stakes="critical", confidence=0.1, context=PRODUCTION
        ),
    ),
    (
        timedelta(days=2),
        "token-alice",
        action(
            description="D: reviewed prod change",
            context={"affects_production": True, "code_review": True},
        ),
    ),
    (
        timedelta(days=1),
        "token-alice",
        action(description="E: warn only", stakes="high", confidence=0.9),
    ),
    (
        timedelta(hours=1),
        "token-bob",
        action(description="F: prod change without review", context=PRODUCTION),
    ),
]


@pytest.fixture
async def history(settings: Settings, embedder: Any) -> Settings:
    """Evaluations spread over the last ten days (the clock is moved back for the old ones)."""
    clock = Clock(NOW)
    app = create_app(settings, runtime=Runtime(now=clock), embedder=embedder)
    async with serve_app(app) as client:
        rpc = Rpc(client)
        for ago, token, act in HISTORY:
            clock.now = NOW - ago
            await check(rpc, act, token=token)
    return settings


def test_the_doc_has_the_blocked_this_week_query() -> None:
    blocks = doc_sql_blocks()
    assert BLOCKED_THIS_WEEK in blocks, list(blocks)
    query = blocks[BLOCKED_THIS_WEEK]
    assert ":week_start" in query and ":rule_id" in query
    for dialect_function in ("now(", "datetime(", "date(", "interval", "current_"):
        assert dialect_function not in query.lower(), dialect_function


@pytest.mark.parametrize(
    ("rule_id", "expected"),
    [
        (
            "production-needs-code-review",
            ["A: prod change without review", "C: prod and risky", "F: prod change without review"],
        ),
        ("no-high-stakes-low-confidence", ["B: risky but reviewed", "C: prod and risky"]),
        ("prefer-staged-rollout", []),  # a warn rule never blocks anything
        ("critical-needs-high-confidence", []),
    ],
)
async def test_blocked_this_week_query_from_the_doc(
    history: Settings, rule_id: str, expected: list[str]
) -> None:
    query = doc_sql_blocks()[BLOCKED_THIS_WEEK]
    rows = await run_doc_sql(history, query, rule_id=rule_id, week_start=NOW - timedelta(days=7))
    assert [row["description"] for row in rows] == expected
    agents = {"A": "alice", "B": "bob", "C": "bob", "F": "bob"}
    assert [row["agent"] for row in rows] == [agents[d[0]] for d in expected]


async def test_every_cookbook_query_runs(history: Settings) -> None:
    blocks = doc_sql_blocks()
    assert len(blocks) >= 4
    one = (
        await sql(
            history,
            "SELECT id FROM guardrail_evaluations WHERE description = :d",
            d="C: prod and risky",
        )
    )[0]["id"]
    params = {
        "rule_id": "production-needs-code-review",
        "week_start": NOW - timedelta(days=7),
        "since": NOW - timedelta(days=7),
        "agent": "bob",
        "evaluation_id": one,
    }
    for heading, query in blocks.items():
        wanted = set(re.findall(r"(?<![:\w]):(\w+)", query))
        assert wanted <= set(params), (heading, wanted - set(params))
        rows = await run_doc_sql(history, query, **params)
        # no rule of this history fails, and none is in shadow mode
        assert rows or any(w in heading.lower() for w in ("could not be", "shadow")), heading
