"""Every param of every method has a limit, stated by rpc.discover and listed in
docs/PROTOCOL.md ("Limits"): a text by ``maxLength``, a list by ``maxItems``, a free-form
object by ``maxProperties``, a number by its range. Past a limit the call is -32602 naming
the field, and ``cstp import`` holds decision files to the same limits."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from app.cli import main
from app.config import Settings
from support.app import Rpc

PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "PROTOCOL.md"
GOOD = "decision: Adopt feature flags\ncategory: process\nconfidence: 0.7\ndate: 2025-01-03\n"
RECORD = {"decision": "Cache search results", "confidence": 0.6, "category": "architecture"}

Limit = tuple[str, str, str, int]  # method, param path, unit, number


def limits_in_schemas(document: dict[str, Any]) -> tuple[set[Limit], list[str]]:
    """Every limit the params schemas state, and the params that have none (a text without
    ``maxLength``, a list without ``maxItems``, an object of no fixed properties without
    ``maxProperties``, a number without both bounds). Enumerations are limited by their values."""
    components = document["components"]["schemas"]
    found: set[Limit] = set()
    unlimited: list[str] = []

    def walk(method: str, schema: dict[str, Any], path: str) -> None:
        if "$ref" in schema:
            schema = components[schema["$ref"].rsplit("/", 1)[-1]]
        for branch in schema.get("anyOf", []):
            walk(method, branch, path)
        kind = schema.get("type")
        if "enum" in schema or "const" in schema or kind in (None, "null", "boolean"):
            return
        where = f"{method} {path}"
        if kind == "string":
            if "maxLength" in schema:
                found.add((method, path, "characters", schema["maxLength"]))
            else:
                unlimited.append(f"{where}: a text with no maxLength")
        elif kind == "array":
            if "maxItems" in schema:
                found.add((method, path, "items", schema["maxItems"]))
            else:
                unlimited.append(f"{where}: a list with no maxItems")
            walk(method, schema.get("items", {}), f"{path}[]")
        elif kind == "object" and "properties" in schema:
            for name, sub in schema["properties"].items():
                walk(method, sub, f"{path}.{name}")
        elif kind == "object":
            if "maxProperties" in schema:
                found.add((method, path, "keys", schema["maxProperties"]))
            else:
                unlimited.append(f"{where}: an object with no maxProperties")
        elif kind in ("integer", "number"):
            low = "minimum" in schema or "exclusiveMinimum" in schema
            high = "maximum" in schema or "exclusiveMaximum" in schema
            if not (low and high):
                unlimited.append(f"{where}: a number without both bounds")
        else:
            unlimited.append(f"{where}: a {kind} this test does not know")

    for method in document["methods"]:
        for param in method["params"]:
            walk(method["name"], param["schema"], param["name"])
    return found, unlimited


def limits_in_protocol_md() -> set[Limit]:
    """The rows of the "| Method | Params | Limit |" table of docs/PROTOCOL.md (an empty
    method cell continues the one above)."""
    text = PROTOCOL.read_text()
    start = text.index("| Method | Params | Limit |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    found: set[Limit] = set()
    method = ""
    for method_cell, params_cell, limit_cell in rows:
        method = method_cell.strip("`") or method
        limit = re.fullmatch(r"([\d,]+) (characters|items|keys)", limit_cell)
        assert limit is not None, f"PROTOCOL.md limits table: {limit_cell!r}"
        number = int(limit.group(1).replace(",", ""))
        for path in re.findall(r"`([^`]+)`", params_cell):
            found.add((method, path, limit.group(2), number))
    return found


async def test_every_param_has_a_limit_and_protocol_md_lists_it(shared_rpc: Rpc) -> None:
    document = await shared_rpc.ok("rpc.discover")
    stated, unlimited = limits_in_schemas(document)
    assert unlimited == []
    documented = limits_in_protocol_md()
    assert sorted(stated - documented) == [], "limits missing from docs/PROTOCOL.md"
    assert sorted(documented - stated) == [], "docs/PROTOCOL.md lists limits the schemas lack"
    # The free-form objects' other limits are in their schemas' descriptions too.
    by_name = {m["name"]: m for m in document["methods"]}
    metadata = next(p for p in by_name["cstp.announceIntent"]["params"] if p["name"] == "metadata")
    assert "8 levels of nesting" in metadata["schema"]["description"]


@pytest.mark.parametrize(
    ("method", "params", "field", "error"),
    [
        ("cstp.recordDecision", {**RECORD, "context": "x" * 20_001}, "context", 20_000),
        ("cstp.listDecisions", {"dateFrom": "2026-01-01" + " " * 60}, "dateFrom", 64),
        (
            "cstp.queryDecisions",
            {"query": "cache", "filters": {"dateBefore": "2" * 65}},
            "filters.dateBefore",
            64,
        ),
        ("cstp.getCalibration", {"agent": {"id": "a" * 257}}, "agent.id", 256),
        ("cstp.getDecision", {"id": "1a2b3c4d5"}, "id", 8),
    ],
)
async def test_a_text_past_its_limit_is_32602_naming_the_field(
    shared_rpc: Rpc, method: str, params: dict[str, Any], field: str, error: int
) -> None:
    answer = await shared_rpc.error(method, params)
    assert answer["code"] == -32602, answer
    assert answer["data"] == {"field": field, "error": f"length must be <= {error}"}


async def test_a_context_at_its_limit_is_stored_whole(rpc: Rpc) -> None:
    context = "Retries pile up. " * 1176 + "x" * 8  # 20,000 characters
    assert len(context) == 20_000
    recorded = await rpc.ok("cstp.recordDecision", {**RECORD, "context": context})
    got = await rpc.ok("cstp.getDecision", {"id": recorded["id"]})
    assert got["decision"]["context"] == context
    # the informational agent object of older clients is still taken, and ignored
    calibration = await rpc.ok("cstp.getCalibration", {"agent": {"id": "me", "x": 1}})
    assert calibration["filters"].get("agent") is None


@pytest.mark.usefixtures("commands_share_the_model")
def test_import_holds_files_to_the_same_limits(settings: Settings, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    journal.mkdir()
    (journal / "at-limit.yaml").write_text(GOOD + "context: " + "x" * 20_000 + "\n")
    (journal / "long-context.yaml").write_text(
        GOOD.replace("feature flags", "long contexts") + "context: " + "x" * 20_001 + "\n"
    )
    (journal / "long-summary.yaml").write_text(
        GOOD.replace("feature flags", "long summaries") + "summary: " + "s" * 20_001 + "\n"
    )
    env = {
        "CSTP_DATABASE_URL": settings.database_url,
        "CSTP_DATA_DIR": str(settings.data_dir),
        "CSTP_DECISIONS_DIR": str(settings.decisions_dir),
        "CSTP_AUTH_TOKENS": "alice:token-alice",
    }
    result = CliRunner().invoke(main, ["import", str(journal)], env=env)
    assert result.exit_code == 1, result.output
    reasons = dict(re.findall(r"could not import (\S+): (.+)", result.output))
    assert reasons == {
        "long-context.yaml": "context: length must be <= 20000",
        "long-summary.yaml": "summary: longer than 20000 characters",
    }, result.output
    assert "files 3, new 1, already present 0, failed 2" in result.output
    exported = [p.read_text() for p in settings.decisions_dir.rglob("*.yaml")]
    assert len(exported) == 1 and "x" * 20_000 in exported[0]
