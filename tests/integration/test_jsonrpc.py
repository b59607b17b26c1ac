"""JSON-RPC 2.0 envelope behaviour over real HTTP: the specification's section 7 examples
(adapted to cstp.* methods), id echo, notifications, batches, body cap and error hygiene."""

from __future__ import annotations

import json
import logging
from typing import Any

import msgspec

from app.operations.registry import Operation

AUTH = {"Authorization": "Bearer token-alice", "Content-Type": "application/json"}


async def post_raw(client: Any, body: bytes) -> Any:
    return await client.post("/cstp", content=body, headers=AUTH)


async def test_call_with_named_params_returns_result(rpc: Any) -> None:
    answer = await rpc.call("cstp.listDecisions", {"limit": 5})
    assert answer["jsonrpc"] == "2.0"
    assert answer["id"] == 1
    assert answer["result"]["total"] == 0


async def test_unknown_method_is_32601(shared_rpc: Any) -> None:
    answer = await shared_rpc.call("foobar")
    assert answer["error"]["code"] == -32601
    assert answer["id"] == 1


async def test_invalid_json_is_parse_error_with_null_id(shared_client: Any) -> None:
    response = await post_raw(
        shared_client, b'{"jsonrpc": "2.0", "method": "foobar, "params": "bar", "baz]'
    )
    assert response.status_code == 200
    assert response.json() == {
        "jsonrpc": "2.0",
        "error": {"code": -32700, "message": "Parse error"},
        "id": None,
    }


async def test_invalid_request_object(shared_client: Any) -> None:
    response = await post_raw(shared_client, b'{"jsonrpc": "2.0", "method": 1, "params": "bar"}')
    body = response.json()
    assert body["error"]["code"] == -32600
    assert body["id"] is None


async def test_wrong_jsonrpc_version_is_invalid_request_echoing_id(shared_client: Any) -> None:
    response = await post_raw(
        shared_client, b'{"jsonrpc": "1.0", "method": "cstp.listDecisions", "id": 7}'
    )
    assert response.json()["error"]["code"] == -32600
    assert response.json()["id"] == 7


async def test_batch_with_invalid_json_is_single_parse_error(shared_client: Any) -> None:
    body = (
        b'[{"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},'
        b' {"jsonrpc": "2.0", "method"]'
    )
    response = await post_raw(shared_client, body)
    answer = response.json()
    assert isinstance(answer, dict)
    assert answer["error"]["code"] == -32700 and answer["id"] is None


async def test_empty_batch_is_one_invalid_request(shared_client: Any) -> None:
    answer = (await post_raw(shared_client, b"[]")).json()
    assert isinstance(answer, dict)
    assert answer["error"]["code"] == -32600 and answer["id"] is None


async def test_invalid_batch_of_one(shared_client: Any) -> None:
    answer = (await post_raw(shared_client, b"[1]")).json()
    assert answer == [
        {"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid Request"}, "id": None}
    ]


async def test_invalid_batch_of_three(shared_client: Any) -> None:
    answer = (await post_raw(shared_client, b"[1,2,3]")).json()
    assert [a["error"]["code"] for a in answer] == [-32600, -32600, -32600]
    assert all(a["id"] is None for a in answer)


async def test_mixed_batch(shared_client: Any) -> None:
    batch = [
        {"jsonrpc": "2.0", "method": "cstp.listDecisions", "params": {"limit": 1}, "id": "1"},
        {"jsonrpc": "2.0", "method": "cstp.listDecisions", "params": {"limit": 2}},
        {"jsonrpc": "2.0", "method": "cstp.listDecisions", "params": {"limit": 3}, "id": "2"},
        {"foo": "boo"},
        {"jsonrpc": "2.0", "method": "foo.get", "params": {"name": "myself"}, "id": "5"},
        {"jsonrpc": "2.0", "method": "cstp.listGuardrails", "id": "9"},
    ]
    answer = (await post_raw(shared_client, json.dumps(batch).encode())).json()
    assert len(answer) == 5
    assert answer[0]["id"] == "1" and answer[0]["result"]["limit"] == 1
    assert answer[1]["id"] == "2" and answer[1]["result"]["limit"] == 3
    assert answer[2] == {
        "jsonrpc": "2.0",
        "error": {"code": -32600, "message": "Invalid Request"},
        "id": None,
    }
    assert answer[3]["id"] == "5" and answer[3]["error"]["code"] == -32601
    assert answer[4]["id"] == "9" and "result" in answer[4]


async def test_all_notification_batch_is_204_empty(shared_client: Any) -> None:
    batch = [
        {"jsonrpc": "2.0", "method": "cstp.listDecisions", "params": {"limit": 1}},
        {"jsonrpc": "2.0", "method": "cstp.listDecisions"},
    ]
    response = await post_raw(shared_client, json.dumps(batch).encode())
    assert response.status_code == 204
    assert response.content == b""


async def test_single_notification_is_executed_without_response(
    client: Any, seed_decision: dict[str, Any], rpc: Any
) -> None:
    body = {"jsonrpc": "2.0", "method": "cstp.recordDecision", "params": seed_decision}
    response = await post_raw(client, json.dumps(body).encode())
    assert response.status_code == 204 and response.content == b""
    listed = await rpc.ok("cstp.listDecisions")
    assert listed["total"] == 1


async def test_params_that_are_not_an_object_are_32602(shared_client: Any) -> None:
    for params in ([1, 2, 3], "bar", 5):
        body = {"jsonrpc": "2.0", "method": "cstp.listDecisions", "params": params, "id": 3}
        answer = (await post_raw(shared_client, json.dumps(body).encode())).json()
        assert answer["error"]["code"] == -32602
        assert answer["error"]["data"]["field"] == "params"
        assert answer["id"] == 3


async def test_ids_come_back_exactly(shared_client: Any) -> None:
    for rid in ["abc", "", 0, -5, 12345678901234, 1.5, None]:
        body = {"jsonrpc": "2.0", "method": "cstp.listDecisions", "id": rid}
        answer = (await post_raw(shared_client, json.dumps(body).encode())).json()
        assert "id" in answer and answer["id"] == rid and type(answer["id"]) is type(rid)


async def test_a_number_id_comes_back_as_the_client_wrote_it(shared_client: Any) -> None:
    """Byte for byte: a client that matches responses by the id's text finds its own."""
    for text in ["1E2", "1.50", "-0.0", "2.5e-3", "7"]:
        single = f'{{"jsonrpc": "2.0", "method": "cstp.listDecisions", "id": {text}}}'
        raw = (await post_raw(shared_client, single.encode())).content
        assert raw.endswith(f'"id":{text}}}'.encode()), raw
        batch = (
            f'[{{"jsonrpc": "2.0", "method": "cstp.listDecisions", "id": "a"}}, '
            f'{{"jsonrpc": "2.0", "method": "nope", "id": {text}}}, '
            f'{{"jsonrpc": "2.0", "method": "cstp.listDecisions"}}, 5]'
        )
        raw = (await post_raw(shared_client, batch.encode())).content
        assert f'"id":{text}}}'.encode() in raw, raw
        assert [item["id"] for item in json.loads(raw)] == ["a", json.loads(text), None]


async def test_invalid_id_types_are_invalid_request(shared_client: Any) -> None:
    for rid in [{"a": 1}, [1], True]:
        body = {"jsonrpc": "2.0", "method": "cstp.listDecisions", "id": rid}
        answer = (await post_raw(shared_client, json.dumps(body).encode())).json()
        assert answer["error"]["code"] == -32600 and answer["id"] is None


async def test_batch_is_capped(shared_client: Any, shared_services: Any) -> None:
    limit = shared_services.settings.max_batch
    batch = [{"jsonrpc": "2.0", "method": "cstp.listDecisions", "id": i} for i in range(limit + 1)]
    answer = (await post_raw(shared_client, json.dumps(batch).encode())).json()
    assert answer["error"]["code"] == -32600
    assert answer["error"]["data"] == {"maxBatch": limit}


async def test_body_over_the_cap_is_413(shared_client: Any, shared_services: Any) -> None:
    big = (
        b'{"jsonrpc":"2.0","method":"cstp.listDecisions","id":1,"params":{"search":"'
        + (b"x" * (shared_services.settings.max_body_bytes + 10))
        + b'"}}'
    )
    response = await post_raw(shared_client, big)
    assert response.status_code == 413
    assert response.json()["error"] == "payload_too_large"


async def test_unexpected_error_is_generic_and_logged(client: Any, rpc: Any, caplog: Any) -> None:
    class NoParams(msgspec.Struct):
        pass

    async def explode(ctx: Any, params: Any) -> Any:
        raise RuntimeError("secret detail /etc/passwd SELECT * FROM decisions")

    client.app.state.registry.add(
        Operation("test.explode", NoParams, dict, explode, "explodes", scopes=("read",))
    )
    with caplog.at_level(logging.INFO, logger="cstp.rpc"):
        answer = await rpc.call("test.explode")
    assert answer["error"] == {"code": -32603, "message": "Internal error"}
    assert "secret" not in json.dumps(answer)
    assert any("secret detail" in (r.exc_text or "") or r.exc_info for r in caplog.records)


async def test_one_structured_log_line_per_call(shared_rpc: Any, caplog: Any) -> None:
    with caplog.at_level(logging.INFO, logger="cstp.rpc"):
        await shared_rpc.call("cstp.listDecisions", {"limit": 2})
        await shared_rpc.call("cstp.getDecision", {"id": "zz"})
    lines = [
        json.loads(r.getMessage())
        for r in caplog.records
        if r.name == "cstp.rpc" and r.getMessage().startswith("{")
    ]
    assert [(line["method"], line["outcome"]) for line in lines] == [
        ("cstp.listDecisions", "ok"),
        ("cstp.getDecision", "-32602"),
    ]
    for line in lines:
        assert line["agent"] == "alice" and line["id"] == 1 and line["durationMs"] >= 0


async def test_batch_items_run_in_their_own_transactions(
    client: Any, rpc: Any, seed_decision: dict[str, Any]
) -> None:
    bad = dict(seed_decision, confidence=7)
    batch = [
        {"jsonrpc": "2.0", "method": "cstp.recordDecision", "params": seed_decision, "id": 1},
        {"jsonrpc": "2.0", "method": "cstp.recordDecision", "params": bad, "id": 2},
        {"jsonrpc": "2.0", "method": "cstp.recordDecision", "params": seed_decision, "id": 3},
    ]
    answer = (await post_raw(client, json.dumps(batch).encode())).json()
    assert [("result" in a) for a in answer] == [True, False, True]
    assert (await rpc.ok("cstp.listDecisions"))["total"] == 2
