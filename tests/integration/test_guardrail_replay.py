"""Replayable verdicts and shadow rules, on SQLite and Postgres.

Every evaluation records the exact rule set it used (stored once per content hash), so
``cstp guardrails replay`` reproduces an old verdict after the rule files changed and the
server restarted. A shadow rule is evaluated and stored (would_block / would_warn) but never
changes ``allowed`` or the answer."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from test_audit_chain import drop_triggers, problems

from app.asgi import create_app
from app.cli import main
from app.config import Settings
from app.search.embedder import Embedder
from support.app import Rpc, serve_app
from support.databases import run_sql

# The commands these tests run in this process use the session's model (conftest).
pytestmark = pytest.mark.usefixtures("commands_share_the_model")

DOC = Path(__file__).resolve().parents[2] / "docs" / "GUARDRAILS.md"
PCI_BLOCKS = """
guardrails:
  - id: payments-needs-pci-review
    description: Payments changes need a PCI review
    action: block
    scope: [payments]
    requirements:
      - {field: pci_review, op: "==", value: true}
    message: "{stakes}-stakes payments change without a PCI review"
  - id: watch-friday-deploys
    description: Deploys on a Friday (watched before it is enforced)
    action: block
    mode: shadow
    conditions:
      - {field: weekday, op: "==", value: friday}
    message: "a deploy on a {weekday}"
  - id: watch-big-batches
    description: Big batches (watched)
    action: warn
    mode: shadow
    conditions:
      - {field: batch_size, op: ">", value: 100}
    message: "a batch of {batch_size}"
"""
PCI_WARNS = PCI_BLOCKS.replace("action: block\n    scope", "action: warn\n    scope")
PAYMENTS = {"description": "Change the card tokenizer", "stakes": "high", "project": "payments"}


async def cstp(url: str, *args: str) -> Result:
    env = {"CSTP_DATABASE_URL": url, "CSTP_GUARDRAILS_DIR": None, "CSTP_AUDIT_KEY": None}
    return await asyncio.to_thread(CliRunner().invoke, main, list(args), env=env)


@pytest.fixture
def rules_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "payments.yaml").write_text(PCI_BLOCKS, encoding="utf-8")
    return folder


async def check(settings: Settings, embedder: Embedder, *actions: dict[str, Any]) -> list[Any]:
    """Each action checked by a freshly built app (a server start) with ``settings``."""
    app = create_app(settings, embedder=embedder)
    async with serve_app(app) as http:
        rpc = Rpc(http)
        return [await rpc.ok("cstp.checkGuardrails", {"action": a}) for a in actions]


async def test_an_old_verdict_is_replayed_with_the_old_rules_after_they_changed(
    settings: Settings, embedder: Embedder, rules_dir: Path
) -> None:
    ops = settings.with_overrides(guardrails_dir=rules_dir)
    (old,) = await check(ops, embedder, PAYMENTS)
    assert old["allowed"] is False
    (rules_dir / "payments.yaml").write_text(PCI_WARNS, encoding="utf-8")
    (new,) = await check(ops, embedder, PAYMENTS)  # a restart with the changed rules
    assert new["allowed"] is True and new["ruleSetVersion"] != old["ruleSetVersion"]

    url = settings.database_url
    replayed = await cstp(url, "guardrails", "replay", old["evaluationId"])
    assert replayed.exit_code == 0, replayed.output
    assert "stored:   allowed false (blocked)" in replayed.output
    assert "replayed: allowed false" in replayed.output
    assert replayed.output.rstrip().endswith("same verdict")
    assert f"(version {old['ruleSetVersion']}, 8 rules)" in replayed.output
    replayed = await cstp(url, "guardrails", "replay", new["evaluationId"])
    assert replayed.exit_code == 0, replayed.output
    assert "replayed: allowed true" in replayed.output

    sets = await run_sql(
        url, "SELECT hash, version, rules FROM guardrail_rule_sets ORDER BY version"
    )
    assert {r["version"] for r in sets} == {old["ruleSetVersion"], new["ruleSetVersion"]}
    used = await run_sql(
        url,
        "SELECT e.id, s.version FROM guardrail_evaluations AS e "
        "JOIN guardrail_rule_sets AS s ON s.hash = e.rule_set_hash",
    )
    assert {r["id"]: r["version"] for r in used} == {
        old["evaluationId"]: old["ruleSetVersion"],
        new["evaluationId"]: new["ruleSetVersion"],
    }

    unknown = await cstp(url, "guardrails", "replay", "no-such-evaluation")
    assert unknown.exit_code == 2
    assert unknown.output.strip() == "Error: no guardrail evaluation with id 'no-such-evaluation'"

    # stored inputs that were edited: the verdict no longer follows from them
    await drop_triggers(url)
    await run_sql(
        url,
        "UPDATE guardrail_evaluations SET facts = :f WHERE id = :i",
        f='{"description": "Change the card tokenizer", "stakes": "high", '
        '"project": "payments", "pci_review": true}',
        i=old["evaluationId"],
    )
    replayed = await cstp(url, "guardrails", "replay", old["evaluationId"])
    assert replayed.exit_code == 1, replayed.output
    assert "differs: allowed: stored false, replayed true" in replayed.output
    assert "DIFFERENT verdict" in replayed.output

    # an edited rule set can no longer be trusted: no replay, and verify says why
    await run_sql(
        url,
        "UPDATE guardrail_rule_sets SET content = REPLACE(content, 'block', 'warn') "
        "WHERE version = :v",
        v=new["ruleSetVersion"],
    )
    replayed = await cstp(url, "guardrails", "replay", new["evaluationId"])
    assert replayed.exit_code == 2, replayed.output
    assert "its content was edited" in replayed.output
    verified = await cstp(url, "audit", "verify")
    assert verified.exit_code == 1
    kinds = {(p.kind, p.table) for p in problems(verified.stdout)}
    assert ("rule-set", "guardrail_rule_sets") in kinds, verified.output


async def test_a_shadow_rule_never_changes_the_verdict_and_is_stored(
    settings: Settings, embedder: Embedder, rules_dir: Path
) -> None:
    ops = settings.with_overrides(guardrails_dir=rules_dir)
    plain = {"description": "Deploy the scheduler", "stakes": "medium", "confidence": 0.9}
    watched, failing, quiet = await check(
        ops,
        embedder,
        {**plain, "context": {"weekday": "friday", "batch_size": 500}},
        {**plain, "context": {"weekday": "friday", "batch_size": "many"}},
        {**plain, "context": {"weekday": "monday", "batch_size": 5}},
    )
    for answer in (watched, failing, quiet):
        assert answer["allowed"] is True
        assert answer["violations"] == [] and answer["warnings"] == []
        assert answer["evaluated"] == 5  # the shipped rules: shadow rules are not counted

    url = settings.database_url
    rows = await run_sql(
        url,
        "SELECT e.id, r.guardrail_id, r.mode, r.fired, r.would_block, r.would_warn, r.message,"
        " r.error FROM guardrail_rule_results AS r "
        "JOIN guardrail_evaluations AS e ON e.id = r.evaluation_id "
        "WHERE r.mode = 'shadow' ORDER BY r.guardrail_id",
    )
    got = {
        (r["id"], r["guardrail_id"]): (
            bool(r["fired"]),
            bool(r["would_block"]),
            bool(r["would_warn"]),
            r["message"],
            r["error"] is not None,
        )
        for r in rows
    }
    assert got == {
        (watched["evaluationId"], "watch-friday-deploys"): (
            False, True, False, "a deploy on a friday", False,
        ),
        (watched["evaluationId"], "watch-big-batches"): (
            False, False, True, "a batch of 500", False,
        ),
        (failing["evaluationId"], "watch-friday-deploys"): (
            False, True, False, "a deploy on a friday", False,
        ),
        # could not be evaluated (a string against a number): it would have warned
        (failing["evaluationId"], "watch-big-batches"): (
            False, False, True, "Guardrail 'watch-big-batches' could not be evaluated", True,
        ),
        (quiet["evaluationId"], "watch-friday-deploys"): (False, False, False, None, False),
        (quiet["evaluationId"], "watch-big-batches"): (False, False, False, None, False),
    }  # fmt: skip
    # an enforced block rule's usual query never counts what a shadow rule would have done
    blocked = await run_sql(
        url,
        "SELECT COUNT(*) AS n FROM guardrail_rule_results WHERE fired = TRUE "
        "AND guardrail_id LIKE 'watch-%'",
    )
    assert blocked[0]["n"] == 0

    # the doc's query for what a shadow rule would have done
    query = shadow_query()
    answer = await run_sql(url, query)
    assert {(r["guardrail_id"], r["would_block"], r["would_warn"]) for r in answer} == {
        ("watch-friday-deploys", 2, 0),
        ("watch-big-batches", 0, 2),
    }
    for evaluation in (watched, failing, quiet):  # replayable like any verdict
        replayed = await cstp(url, "guardrails", "replay", evaluation["evaluationId"])
        assert replayed.exit_code == 0, replayed.output


async def test_list_guardrails_shows_each_rules_mode(
    settings: Settings, embedder: Embedder, rules_dir: Path
) -> None:
    app = create_app(settings.with_overrides(guardrails_dir=rules_dir), embedder=embedder)
    async with serve_app(app) as http:
        listed = await Rpc(http).ok("cstp.listGuardrails")
    modes = {g["id"]: g["mode"] for g in listed["guardrails"]}
    assert modes["watch-friday-deploys"] == modes["watch-big-batches"] == "shadow"
    assert modes["payments-needs-pci-review"] == modes["prefer-staged-rollout"] == "enforce"


async def test_an_unknown_mode_stops_the_server_with_file_and_line(
    settings: Settings, embedder: Embedder, rules_dir: Path
) -> None:
    (rules_dir / "payments.yaml").write_text(
        PCI_BLOCKS.replace("mode: shadow", "mode: watch", 1), encoding="utf-8"
    )
    with pytest.raises(ValueError, match=r"payments\.yaml:13: unknown mode 'watch'"):
        create_app(settings.with_overrides(guardrails_dir=rules_dir), embedder=embedder)


def shadow_query() -> str:
    doc = DOC.read_text(encoding="utf-8")
    section = doc.split("### What would the shadow rules have done?", 1)[1]
    block = re.search(r"^```sql\n(.*?)^```", section, flags=re.M | re.S)
    assert block is not None
    return block.group(1)
