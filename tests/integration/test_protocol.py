"""The protocol as documented: rpc.discover is a valid OpenRPC document of every registered
method, and docs/PROTOCOL.md names every method and param, with examples that validate against
the params schemas and run against a real server, whose answers validate against the result
schemas."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from support.app import Rpc

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = ROOT / "docs" / "PROTOCOL.md"
META_SCHEMA = json.loads((ROOT / "tests" / "data" / "openrpc-meta-schema.json").read_text())
# The meta-schema describes each schema in the document by reference to the JSON Schema
# meta-schema at meta.json-schema.tools, a draft-07 one: resolved here to draft 7's own,
# which jsonschema ships, so nothing is fetched.
DRAFT7_META = jsonschema.Draft7Validator.META_SCHEMA
META_REFS = Registry().with_resource(
    "https://meta.json-schema.tools",
    Resource.from_contents(DRAFT7_META, default_specification=DRAFT7),
)
SECTION = re.compile(r"^### (\S+)\n(.*?)(?=^#{2,3} |\Z)", re.S | re.M)
JSON_BLOCK = re.compile(r"```json\n(.*?)```", re.S)


APPROVAL_METHODS = ("cstp.getApproval", "cstp.listApprovals", "cstp.decideApproval")


def sections() -> dict[str, str]:
    return {m.group(1): m.group(2) for m in SECTION.finditer(PROTOCOL.read_text())}


def example(method: str) -> dict[str, Any]:
    """The section's first JSON block: a whole request of that method."""
    block = JSON_BLOCK.search(sections()[method])
    assert block is not None, f"docs/PROTOCOL.md has no example for {method}"
    request: dict[str, Any] = json.loads(block.group(1))
    assert request["jsonrpc"] == "2.0" and request["method"] == method, request
    return request


def params_schema(document: dict[str, Any], method: dict[str, Any]) -> dict[str, Any]:
    """The method's by-name params as one object schema, its refs resolvable."""
    return {
        "type": "object",
        "properties": {p["name"]: p["schema"] for p in method["params"]},
        "required": [p["name"] for p in method["params"] if p.get("required")],
        "components": document["components"],
    }


def strict(schema: Any) -> Any:
    """``schema`` with every object that lists its properties closed to others: the server
    ignores an unknown param (compatibility), so without this a misspelled name in an example
    would validate and silently do nothing."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: strict(value) for key, value in schema.items()}
    if isinstance(schema.get("properties"), dict) and "additionalProperties" not in schema:
        closed["additionalProperties"] = False
    return closed


def result_schema(document: dict[str, Any], method: dict[str, Any]) -> dict[str, Any]:
    return {**method["result"]["schema"], "components": document["components"]}


@pytest.fixture(scope="module")
async def document(shared_rpc: Rpc) -> dict[str, Any]:
    result: dict[str, Any] = await shared_rpc.ok("rpc.discover")
    return result


async def test_rpc_discover_is_a_valid_openrpc_document_of_every_method(
    shared_rpc: Rpc, document: dict[str, Any]
) -> None:
    jsonschema.Draft7Validator(META_SCHEMA, registry=META_REFS).validate(document)
    registry = shared_rpc.client.app.state.registry
    assert [m["name"] for m in document["methods"]] == registry.names()
    assert "rpc.discover" in registry.names()
    by_name = {m["name"]: m for m in document["methods"]}
    record = by_name["cstp.recordDecision"]
    required = {p["name"] for p in record["params"] if p["required"]}
    assert required == {"decision", "confidence", "category"}
    assert {e["code"] for e in by_name["cstp.getDecision"]["errors"]} >= {-32007, -32602}
    # Patterns are ECMA-262 (JSON Schema's dialect): no Python-only anchors.
    assert "\\A" not in json.dumps(document) and "\\Z" not in json.dumps(document)
    # A param schema rejects what the server rejects.
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            {"decision": "x", "confidence": 1.5, "category": "process"},
            params_schema(document, record),
        )
    # And the examples' check catches a misspelled name.
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            {"decision": "x", "confidence": 0.5, "category": "process", "tgas": ["a"]},
            strict(params_schema(document, record)),
        )


async def test_the_discover_document_is_the_same_for_every_agent(
    shared_rpc: Rpc, document: dict[str, Any]
) -> None:
    assert await shared_rpc.ok("rpc.discover", token="token-bob") == document


def test_protocol_md_names_every_method_and_param(shared_client: Any) -> None:
    from app.rpc.discover import build_document

    documented = sections()
    described = build_document(shared_client.app.state.registry)
    for method in described.methods:
        assert method["name"] in documented, f"{method['name']} missing from PROTOCOL.md"
        text = documented[method["name"]]
        for param in method["params"]:
            assert f"`{param['name']}`" in text, (
                f"param {param['name']} of {method['name']} missing from PROTOCOL.md"
            )
    for name in documented:
        assert name in shared_client.app.state.registry.names(), f"PROTOCOL.md documents {name}"


async def test_every_example_validates_and_its_answer_matches_the_result_schema(
    shared_rpc: Rpc, document: dict[str, Any]
) -> None:
    """Run the examples in the page's order (announce, record with the same correlationId,
    then the rest on the decision recorded), as a reader would."""
    recorded_id = None
    for method in document["methods"]:
        request = example(method["name"])
        jsonschema.validate(request.get("params", {}), strict(params_schema(document, method)))
    order = list(sections())
    by_name = {m["name"]: m for m in document["methods"]}
    for name in order:
        if name in APPROVAL_METHODS:  # need an escalation: tests/integration/test_approvals.py
            continue
        request = example(name)
        params = request.get("params")
        if recorded_id is not None and isinstance(params, dict) and params.get("id"):
            params = {**params, "id": recorded_id}
        result = await shared_rpc.ok(name, params)
        jsonschema.validate(result, result_schema(document, by_name[name]))
        if name == "cstp.recordDecision":
            recorded_id = result["id"]
            assert result["indexed"] is True
    assert recorded_id is not None
    # The recorded decision, reviewed by the example, still matches getDecision's schema with
    # its reviews, and announce's similar decisions now include a reviewed one.
    got = await shared_rpc.ok("cstp.getDecision", {"id": recorded_id})
    assert got["decision"]["reviews"] and got["decision"]["correlationId"]
    announced = await shared_rpc.ok("cstp.announceIntent", {"intent": "Pick a database for memory"})
    jsonschema.validate(announced, result_schema(document, by_name["cstp.announceIntent"]))
    assert any(d.get("outcome") == "failure" for d in announced["similarDecisions"])
    grouped = await shared_rpc.ok(
        "cstp.getCalibration", {"groupBy": "confidenceBucket", "minDecisions": 1}
    )
    jsonschema.validate(grouped, result_schema(document, by_name["cstp.getCalibration"]))
    assert grouped["groups"]
