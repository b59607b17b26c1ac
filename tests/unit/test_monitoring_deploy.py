"""deploy/monitoring as Prometheus, Grafana and Compose would load it (none of them runs
here): every query parses as PromQL and names only series the server exports (or
Prometheus's own ``up``), every alert has what an on-call person needs, the dashboard shows
every series, and the files the compose file and the provisioning name exist."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
OPERATIONS = MONITORING.parents[1] / "docs" / "OPERATIONS.md"

# What GET /metrics exports (docs/OPERATIONS.md, "Monitoring"), by series name.
SERIES = {
    "cstp_calls_total",
    "cstp_call_duration_seconds",
    "cstp_rate_limit_refusals_total",
    "cstp_guardrail_verdicts_total",
    "cstp_outbox_events",
    "cstp_webhook_deliveries",
    "cstp_approvals",
    "cstp_dependency_up",
    "cstp_audit_chain_head_seq",
    "cstp_audit_chain_problems",
    "cstp_audit_chain_verified_timestamp_seconds",
    "cstp_audit_chain_verify_interval_seconds",
}
HISTOGRAMS = {"cstp_call_duration_seconds"}
PROMETHEUS_OWN = {"up"}
# Grafana's variables, as the dashboard's queries use them, by a value PromQL accepts.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$method": ".*"}


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def selectors(expr: Any) -> Iterator[str]:
    """The metric names an expression selects, from its syntax tree."""
    if isinstance(expr, promql_parser.VectorSelector):
        yield expr.name
        return
    children: list[Any] = []
    if isinstance(expr, promql_parser.BinaryExpr):
        children = [expr.lhs, expr.rhs]
    elif isinstance(expr, promql_parser.Call):
        children = list(expr.args)
    elif isinstance(expr, promql_parser.AggregateExpr):
        children = [expr.expr, expr.param]
    elif isinstance(expr, promql_parser.MatrixSelector):
        children = [expr.vector_selector]
    elif isinstance(
        expr, (promql_parser.SubqueryExpr, promql_parser.ParenExpr, promql_parser.UnaryExpr)
    ):
        children = [expr.expr]
    else:  # a node this walk does not know could hide a selector: fail rather than miss it
        assert isinstance(expr, (promql_parser.NumberLiteral, promql_parser.StringLiteral)), expr
    for child in children:
        if child is not None:
            yield from selectors(child)


def series_of(name: str) -> str:
    """The exported series a selected name belongs to (a histogram's _bucket, _sum, _count)."""
    for histogram in HISTOGRAMS:
        if name in {f"{histogram}_bucket", f"{histogram}_sum", f"{histogram}_count"}:
            return histogram
    return name


def names_in(query: str) -> set[str]:
    parsed = promql_parser.parse(query)  # a syntax error raises ValueError
    return {series_of(name) for name in selectors(parsed)}


def test_the_series_finder_reads_every_kind_of_expression() -> None:
    query = (
        "histogram_quantile(0.9, sum by (le) (rate(a_bucket[5m]))) / -(b) "
        "and on() deriv(max(c)[15m:1m]) or absent(d)"
    )
    assert names_in(query) == {"a_bucket", "b", "c", "d"}


def alert_rules() -> list[dict[str, Any]]:
    groups = load_yaml(MONITORING / "prometheus" / "alerts.yml")["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_every_alert_has_a_query_a_duration_a_severity_and_words_for_the_on_call() -> None:
    rules = alert_rules()
    assert rules
    for rule in rules:
        name = rule.get("alert")
        assert name and set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule
        assert names_in(rule["expr"]) <= SERIES | PROMETHEUS_OWN, name
        assert re.fullmatch(r"(\d+(ms|s|m|h|d|w|y))+", rule["for"]), name  # "0m" too
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        notes = rule["annotations"]
        assert notes["summary"] and notes["description"], name
        assert notes["runbook"] == f"docs/OPERATIONS.md#{name.lower()}", name


def test_the_alerts_the_operations_guide_explains() -> None:
    names = {rule["alert"] for rule in alert_rules()}
    assert names >= {
        "CstpDown",
        "CstpDependencyDown",
        "CstpServerErrorRateHigh",
        "CstpOutboxBacklogGrowing",
        "CstpOutboxEventsDead",
        "CstpAuditChainProblems",
        "CstpAuditChainNotVerified",
    }
    guide = OPERATIONS.read_text(encoding="utf-8")
    for name in names:  # each runbook anchor is a heading of the guide
        assert f"\n#### {name}\n" in guide, name


def dashboard_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            query = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                query = query.replace(variable, value)
            yield panel["title"], query


def test_the_dashboard_shows_every_series_and_only_those() -> None:
    dashboard = json.loads((MONITORING / "grafana" / "cstp-dashboard.json").read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), ids
    shown: set[str] = set()
    for title, query in dashboard_queries(dashboard):
        try:
            names = names_in(query)
        except ValueError as exc:
            raise AssertionError(f"{title}: {exc}: {query}") from None
        assert names and names <= SERIES, (title, names)
        shown |= names
    assert shown == SERIES
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["gridPos"]["w"] > 0 and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
    assert {"datasource", "method"} <= variables


def test_prometheus_scrapes_metrics_with_a_token_file_and_loads_the_rules() -> None:
    config = load_yaml(MONITORING / "prometheus" / "prometheus.yml")
    for rule_file in config["rule_files"]:
        assert (MONITORING / "prometheus" / rule_file).is_file(), rule_file
    (job,) = (j for j in config["scrape_configs"] if j["job_name"] == "cstp")
    assert job["metrics_path"] == "/metrics"
    assert job["authorization"]["type"] == "Bearer"
    compose = load_yaml(MONITORING / "docker-compose.yml")
    secret = compose["services"]["prometheus"]["secrets"][0]
    assert job["authorization"]["credentials_file"] == f"/run/secrets/{secret}"
    assert secret in compose["secrets"]


def test_the_monitoring_profile_runs_prometheus_and_grafana_beside_the_server() -> None:
    compose = load_yaml(MONITORING / "docker-compose.yml")
    included = [MONITORING / item for item in compose["include"]]
    assert all(path.is_file() for path in included), included
    servers = {name for path in included for name in load_yaml(path)["services"]}
    assert "cstp" in servers and compose["name"] == load_yaml(included[0])["name"]
    for name in ("prometheus", "grafana"):
        service = compose["services"][name]
        assert service["profiles"] == ["monitoring"], name
        for volume in service["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (MONITORING / source).exists(), (name, source)
    grafana = compose["services"]["grafana"]["volumes"]
    mounted = {v.split(":")[1]: v.split(":")[0] for v in grafana if v.startswith(".")}
    provisioning = MONITORING / mounted["/etc/grafana/provisioning"]
    (provider,) = load_yaml(provisioning / "dashboards" / "cstp.yml")["providers"]
    dashboards = [
        target for target in mounted if target.startswith(provider["options"]["path"] + "/")
    ]
    assert dashboards == ["/etc/grafana/dashboards/cstp-dashboard.json"]
    (source,) = load_yaml(provisioning / "datasources" / "prometheus.yml")["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"


@pytest.mark.parametrize("path", sorted(MONITORING.rglob("*.yml")), ids=lambda p: p.name)
def test_every_yaml_file_parses(path: Path) -> None:
    assert isinstance(load_yaml(path), dict)


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (it ships with Prometheus)")
def test_promtool_checks_the_rules_runs_their_tests_and_checks_the_config(tmp_path: Path) -> None:
    """Prometheus's own checker, where it is installed: the rules, their unit tests
    (prometheus/alerts_test.yml: each alert fires on the series it is meant for, with the
    words it says), and the scrape configuration with its token file at hand."""
    assert PROMTOOL is not None
    folder = MONITORING / "prometheus"
    run = [PROMTOOL, "check", "rules", "alerts.yml"], [PROMTOOL, "test", "rules", "alerts_test.yml"]
    for argv in run:
        done = subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    token = tmp_path / "token"
    token.write_text("a-token\n")
    config = load_yaml(folder / "prometheus.yml")
    config["scrape_configs"][0]["authorization"]["credentials_file"] = str(token)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    shutil.copy(folder / "alerts.yml", tmp_path / "alerts.yml")
    done = subprocess.run(
        [PROMTOOL, "check", "config", "prometheus.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
