"""The terminal client's pure helpers: the endpoint from CSTP_URL, ``key=value`` options and
the one line an RPC error becomes (the commands against a server: integration/test_client_cli)."""

from __future__ import annotations

from app.cli.client.options import parse_pairs
from app.cli.client.transport import endpoint, rpc_error_line


def test_helpers() -> None:
    assert endpoint("http://h:1") == endpoint("http://h:1/cstp/") == "http://h:1/cstp"
    assert endpoint("h:1") == "http://h:1/cstp"
    assert parse_pairs(["a=true", "b=3", "c=0.5", "d=x y", "e=", "f=[1]"], "--x") == {
        "a": True,
        "b": 3,
        "c": 0.5,
        "d": "x y",
        "e": "",
        "f": [1],
    }
    assert rpc_error_line(
        {
            "code": -32602,
            "message": "Invalid params",
            "data": {"errors": [{"field": "a", "error": "bad"}, {"field": "b", "error": "worse"}]},
        }
    ) == ("error -32602 Invalid params: a bad; b worse")
    assert rpc_error_line(
        {"code": -32002, "message": "Rate limited", "data": {"retryAfterMs": 1500}}
    ) == ("error -32002 Rate limited: retry in 1.5 s")
