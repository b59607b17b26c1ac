"""``cstp mcp``: the MCP face on stdin/stdout, for clients that spawn a local command.

Every tool call is forwarded to a running server's ``/cstp`` (``CSTP_URL``, ``CSTP_TOKEN``),
so that server stays the one writer of its database and embedded index, and the agent is
the token's, exactly as over HTTP. The tools are the same table's, with the same schemas.
Nothing but the protocol goes to stdout; logs go to stderr.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import httpx
from mcp.server import ServerRequestContext
from mcp.server.stdio import stdio_server

from app.errors import UNAVAILABLE, CstpError
from app.operations.registry import Operation
from app.table import build_registry

from .tools import build_server

TIMEOUT = httpx.Timeout(60.0, connect=5.0)
RETRY_MS = 2000  # what a model is told to wait when the server cannot be reached


class Forwarder:
    """One JSON-RPC call per tool call, to the server at ``endpoint`` with ``token``."""

    def __init__(self, endpoint: str, token: str) -> None:
        self.endpoint = endpoint
        self.headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self.client = httpx.AsyncClient(timeout=TIMEOUT, follow_redirects=False)
        self.sent = 0

    async def call(
        self, method: str, params: dict[str, Any], trace: Mapping[str, str] | None = None
    ) -> Any:
        """``trace``: the caller's trace context headers, passed on to the server."""
        self.sent += 1
        body = {"jsonrpc": "2.0", "id": self.sent, "method": method, "params": params}
        headers = self.headers if not trace else {**self.headers, **trace}
        try:
            response = await self.client.post(self.endpoint, json=body, headers=headers)
        except httpx.HTTPError:
            raise self._unreachable() from None
        if response.status_code == 401:
            raise CstpError(
                UNAVAILABLE,
                "Unavailable: the CSTP server refused CSTP_TOKEN",
                {"retryAfterMs": RETRY_MS},
            )
        if response.status_code != 200:
            raise self._unreachable(f"answered HTTP {response.status_code}")
        try:
            answer = response.json()
        except ValueError:
            raise self._unreachable("did not answer JSON") from None
        if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
            error = answer["error"]
            raise CstpError(
                int(error.get("code", -32603)), str(error.get("message", "")), error.get("data")
            )
        if not isinstance(answer, dict) or "result" not in answer:
            raise self._unreachable("did not answer a JSON-RPC response")
        return answer["result"]

    def _unreachable(self, how: str = "is unreachable") -> CstpError:
        return CstpError(
            UNAVAILABLE,
            f"Unavailable: the CSTP server at {self.endpoint} {how}",
            {"retryAfterMs": RETRY_MS},
        )

    async def aclose(self) -> None:
        await self.client.aclose()


async def serve(endpoint: str, token: str) -> None:
    forwarder = Forwarder(endpoint, token)

    async def call(
        operation: Operation[Any, Any], arguments: dict[str, Any], ctx: ServerRequestContext
    ) -> Any:
        return await forwarder.call(operation.name, arguments, trace_headers(ctx.meta))

    server = build_server(build_registry(), call)
    try:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        await forwarder.aclose()


# The W3C trace context a client may put in a request's ``_meta``: the server continues the
# trace from the same names as HTTP headers (app.rpc.route).
TRACE_KEYS = ("traceparent", "tracestate")


def trace_headers(meta: Mapping[str, Any] | None) -> dict[str, str]:
    """The trace context headers of a tool call's ``_meta``, as given (the server's
    propagator checks them), when they can be a header at all."""
    if not meta:
        return {}
    return {key: meta[key] for key in TRACE_KEYS if _header_value(meta.get(key))}


def _header_value(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 512 and value.isascii() and value.isprintable()


def run(endpoint: str, token: str) -> None:
    anyio.run(serve, endpoint, token)
