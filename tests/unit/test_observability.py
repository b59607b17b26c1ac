"""The metrics' instruments without a server: what a call and an evaluation count, the chain
verification's series absent until it has run, the schedule the worker processes share, and
``CSTP_AUDIT_VERIFY_INTERVAL``. (tests/integration/test_metrics.py scrapes a real server.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.config import ConfigError, Settings
from app.guardrails.evaluate import RuleCheck
from app.observability.metrics import Metrics, Scrape
from app.system.chain_verification import Schedule


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(Scrape(metrics.collectors())).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_a_call_counts_by_method_face_and_code_and_a_refusal_by_method() -> None:
    metrics = Metrics(["cstp.listDecisions", "cstp.checkDrift"])
    started = time.perf_counter()
    metrics.call("cstp.listDecisions", "jsonrpc", "ok", started)
    metrics.call("cstp.listDecisions", "jsonrpc", "ok", started)
    metrics.call("cstp.listDecisions", "mcp", "-32002", started)
    found = samples(metrics)
    calls = {k[1]: v for k, v in found.items() if k[0] == "cstp_calls_total"}
    assert calls == {
        (("code", "ok"), ("face", "jsonrpc"), ("method", "cstp.listDecisions")): 2.0,
        (("code", "-32002"), ("face", "mcp"), ("method", "cstp.listDecisions")): 1.0,
    }
    assert found["cstp_rate_limit_refusals_total", (("method", "cstp.listDecisions"),)] == 1
    counts = {k[1]: v for k, v in found.items() if k[0] == "cstp_call_duration_seconds_count"}
    # a method given at the start has its histogram before its first call
    assert counts == {
        (("method", "cstp.checkDrift"),): 0.0,
        (("method", "cstp.listDecisions"),): 3.0,
    }


def test_an_evaluation_counts_the_rules_that_fired_or_would_have() -> None:
    metrics = Metrics()
    metrics.verdicts(
        [
            RuleCheck("blocks", "block", fired=True),
            RuleCheck("quiet", "block", fired=False),
            RuleCheck("warns", "warn", fired=True),
            RuleCheck("broken", "escalate", fired=False, error="a type mix-up"),  # fails closed
            RuleCheck("trial", "block", fired=False, mode="shadow", would=True),
            RuleCheck("trial-quiet", "warn", fired=False, mode="shadow", would=False),
        ]
    )
    metrics.verdicts([RuleCheck("blocks", "block", fired=True)])
    verdicts = {k[1]: v for k, v in samples(metrics).items() if k[0].startswith("cstp_guardrail")}
    assert verdicts == {
        (("mode", "enforce"), ("rule", "blocks"), ("verdict", "block")): 2.0,
        (("mode", "enforce"), ("rule", "warns"), ("verdict", "warn")): 1.0,
        (("mode", "enforce"), ("rule", "broken"), ("verdict", "escalate")): 1.0,
        (("mode", "shadow"), ("rule", "trial"), ("verdict", "block")): 1.0,
    }


def test_the_chain_series_are_absent_until_a_verification_ends() -> None:
    metrics = Metrics()
    assert not {name for name, _ in samples(metrics)} & {
        "cstp_audit_chain_problems",
        "cstp_audit_chain_verified_timestamp_seconds",
    }
    metrics.chain_verified(0, 1_700_000_000.5)
    metrics.chain_verified(2, 1_700_000_100.0)
    found = samples(metrics)
    assert found["cstp_audit_chain_problems", ()] == 2
    assert found["cstp_audit_chain_verified_timestamp_seconds", ()] == 1_700_000_100.0


def test_the_processes_sharing_a_folder_take_turns_and_see_each_others_verification(
    tmp_path: Path,
) -> None:
    one, other = Schedule(tmp_path), Schedule(tmp_path)
    assert one.last() == other.last() == 0.0  # never verified
    assert one.take_turn()
    assert not other.take_turn()  # one at a time
    one.done(1_700_000_000.25)
    one.end_turn()
    assert other.last() == 1_700_000_000.25
    assert other.take_turn()
    other.end_turn()
    alone = Schedule(None)
    assert alone.take_turn() and alone.take_turn()
    alone.done(5.0)
    assert alone.last() == 5.0


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("", 0), ("0", 0), ("6h", 21600), ("30m", 1800), ("1d", 86400), ("90", 90), ("2H", 7200)],
)
def test_the_verify_interval_is_a_period_and_0_is_off(value: str, seconds: int) -> None:
    env = {"CSTP_AUDIT_VERIFY_INTERVAL": value}
    assert Settings.from_env(env).audit_verify_seconds == seconds


@pytest.mark.parametrize("value", ["6 hours", "-1", "1.5h", "59s", "367d"])
def test_a_verify_interval_that_is_no_period_or_out_of_bounds_stops_start_up(value: str) -> None:
    with pytest.raises(ConfigError, match="CSTP_AUDIT_VERIFY_INTERVAL"):
        Settings.from_env({"CSTP_AUDIT_VERIFY_INTERVAL": value})
