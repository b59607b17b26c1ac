"""CSTP_RETRIEVAL_MODE: how queryDecisions searches when a call does not say, and how
announceIntent does (hybrid unless set)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from app.asgi import create_app
from app.config import ConfigError, Settings
from support.app import Rpc, serve_app


def test_the_setting_is_read_and_checked() -> None:
    assert Settings.from_env({}).retrieval_mode == "hybrid"
    assert Settings.from_env({"CSTP_RETRIEVAL_MODE": " Semantic "}).retrieval_mode == "semantic"
    with pytest.raises(ConfigError, match="CSTP_RETRIEVAL_MODE"):
        Settings.from_env({"CSTP_RETRIEVAL_MODE": "fuzzy"})


@pytest.mark.parametrize("mode", ["semantic", "keyword", "hybrid"])
async def test_the_server_default_is_the_setting(
    settings: Settings, embedder: Any, mode: str
) -> None:
    app = create_app(replace(settings, retrieval_mode=mode), embedder=embedder)
    async with serve_app(app) as client:
        rpc = Rpc(client)
        recorded = await rpc.ok(
            "cstp.recordDecision",
            {
                "decision": "Escalate OPS-7781 to the vendor",
                "confidence": 0.6,
                "category": "process",
            },
        )
        answer = await rpc.ok("cstp.queryDecisions", {"query": "OPS-7781"})
        assert answer["retrievalMode"] == mode
        assert [d["id"] for d in answer["decisions"]] == [recorded["id"]]
        assert (await rpc.ok("cstp.queryDecisions", {"query": "x", "retrievalMode": "semantic"}))[
            "retrievalMode"
        ] == "semantic"  # a call's own mode wins
        similar = (
            await rpc.ok(
                "cstp.announceIntent", {"intent": "Escalate OPS-7781", "category": "process"}
            )
        )["similarDecisions"]
        assert [s["id"] for s in similar] == [recorded["id"]]
        assert 0.0 <= similar[0]["distance"] <= 2.0  # every mode gives announceIntent distances
