"""Free-form objects (announceIntent's metadata, checkGuardrails' action.context,
reviewDecision's affectedKpis) have limits on depth, keys and size: past them, -32602 names
the field, and nothing is stored that derived data could not be made from."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from app.config import Settings
from app.operations.params import (
    FREE_FORM_MAX_BYTES,
    FREE_FORM_MAX_DEPTH,
    FREE_FORM_MAX_KEY_LENGTH,
    FREE_FORM_MAX_KEYS,
)
from support.app import Rpc
from support.waiting import poll_until


def nested(depth: int) -> dict[str, Any]:
    """``depth`` levels of objects: {"a": {"a": ... {"a": 1}}}."""
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


TOO_MUCH = [
    (nested(FREE_FORM_MAX_DEPTH + 1), "is nested more than 8 levels deep"),
    (nested(400), "is nested more than 8 levels deep"),
    ({"list": [[[[[[[[1]]]]]]]]}, "is nested more than 8 levels deep"),
    ({f"k{i}": i for i in range(FREE_FORM_MAX_KEYS + 1)}, "has more than 256 keys in all"),
    ({f"k{i}": {f"j{j}": j for j in range(30)} for i in range(9)}, "has more than 256 keys in all"),
    ({"k" * (FREE_FORM_MAX_KEY_LENGTH + 1): 1}, "has a key longer than 256 characters"),
    ({"blob": "x" * FREE_FORM_MAX_BYTES}, "is larger than 65536 bytes as JSON"),
]


async def calls(rpc: Rpc, value: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(method, field, answer) of one call per free-form field holding ``value``."""
    recorded = await rpc.ok(
        "cstp.recordDecision",
        {"decision": "Cache search results", "confidence": 0.6, "category": "architecture"},
    )
    return [
        (
            "cstp.announceIntent",
            "metadata",
            await rpc.call("cstp.announceIntent", {"intent": "Add a cache", "metadata": value}),
        ),
        (
            "cstp.checkGuardrails",
            "action.context",
            await rpc.call(
                "cstp.checkGuardrails", {"action": {"description": "Add a cache", "context": value}}
            ),
        ),
        (
            "cstp.reviewDecision",
            "affectedKpis",
            await rpc.call(
                "cstp.reviewDecision",
                {"id": recorded["id"], "outcome": "success", "affectedKpis": value},
            ),
        ),
    ]


@pytest.mark.parametrize(("value", "problem"), TOO_MUCH)
async def test_a_free_form_object_past_its_limits_is_32602_naming_the_field(
    shared_rpc: Rpc, value: dict[str, Any], problem: str
) -> None:
    for method, field, answer in await calls(shared_rpc, value):
        error = answer.get("error")
        assert error is not None and error["code"] == -32602, (method, answer)
        assert error["data"]["field"].startswith(field), (method, error)
        assert error["data"]["error"] == problem, (method, error)
    decisions = (await shared_rpc.ok("cstp.listDecisions"))["decisions"]
    assert all(d["status"] == "pending" for d in decisions)  # no review went in


async def test_a_free_form_object_at_its_limits_is_taken_and_exported(
    rpc: Rpc, settings: Settings
) -> None:
    at_limits = {**nested(FREE_FORM_MAX_DEPTH), "list": [1, 2, 3], "text": "x" * 1000}
    for method, _field, answer in await calls(rpc, at_limits):
        assert "result" in answer, (method, answer)
    reviewed = [
        d for d in (await rpc.ok("cstp.listDecisions"))["decisions"] if d["status"] == "reviewed"
    ]
    got = await rpc.ok("cstp.getDecision", {"id": reviewed[0]["id"]})
    assert got["decision"]["affectedKpis"] == at_limits
    # The review's YAML file holds the whole object (the export is the relay's, after the
    # answer: waited for).
    path = settings.decisions_dir / got["decision"]["path"].removeprefix("decisions/")

    async def exported() -> tuple[bool, Any]:
        kpis = yaml.safe_load(path.read_text()).get("affected_kpis") if path.exists() else None
        return kpis == at_limits, kpis

    await poll_until(exported, 10, "the review's affected KPIs in the YAML file")


async def test_the_deep_path_is_named_inside_the_field(shared_rpc: Rpc) -> None:
    error = await shared_rpc.error("cstp.announceIntent", {"intent": "x", "metadata": nested(12)})
    assert error["data"]["field"] == "metadata" + ".a" * FREE_FORM_MAX_DEPTH
