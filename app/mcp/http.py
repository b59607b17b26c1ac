"""``/mcp``: the MCP face over Streamable HTTP, in the same Litestar app as ``/cstp``.

As strict as ``/cstp``: the same bearer tokens (HTTP 401 before the SDK sees the request),
the agent always the token's, the same body cap, and every tool call run by the same runner
(the same rate limits, transactions and audit rows). The SDK's session manager runs
stateless with JSON responses: no session lives in one process, so any worker can answer any
request. Its DNS-rebinding protection is on: only the Host names of
``CSTP_MCP_ALLOWED_HOSTS`` (default: this machine's loopback names and ``CSTP_HOST``) are
served; others get HTTP 421.

Only POST is served. A stateless server has nothing to send on a stream of its own, yet the
SDK would hold a GET open for ever (a socket and its memory per request); the MCP
specification lets a server that offers no such stream answer 405, which the SDK's client
takes in its stride. DELETE (ending a session) means nothing without sessions either.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, cast

from litestar import Litestar, asgi
from litestar.enums import ScopeType
from litestar.types import HTTPResponseStartEvent, Receive, Scope, Send
from mcp.server import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from app.errors import internal_error
from app.operations.registry import Operation, Registry
from app.operations.runner import Runner

from .tools import build_server

if TYPE_CHECKING:
    from app.auth import TokenTable
    from app.config import Settings

AGENT_KEY = "cstp.agent"  # where the gate leaves the token's agent in the ASGI scope
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
UNAUTHORIZED = b'{"error":"unauthorized","message":"%s"}'
POST_ONLY = (
    b'{"error":"method_not_allowed","message":"/mcp takes POST only: '
    b'this stateless server offers no stream"}'
)

# The SDK logs every stateless request's end at INFO ("Terminating session: None").
logging.getLogger("mcp.server.streamable_http_manager").setLevel(logging.WARNING)


def allowed_hosts(settings: Settings) -> list[str] | None:
    """The Host values to serve (each with and without a port); None: any host."""
    if settings.mcp_allowed_hosts == ("*",):
        return None
    names = list(settings.mcp_allowed_hosts) or [*LOOPBACK, settings.host]
    hosts: list[str] = []
    for name in names:
        if name in ("0.0.0.0", "::"):
            continue  # a bind address, not a name a client sends
        hosts.extend([name] if ":" in name.lstrip("[").split("]")[-1] else [name, f"{name}:*"])
    return list(dict.fromkeys(hosts))


def security(settings: Settings) -> TransportSecuritySettings:
    hosts = allowed_hosts(settings)
    if hosts is None:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    origins = [f"{scheme}://{host}" for host in hosts for scheme in ("http", "https")]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )


def build_mcp_mount(
    settings: Settings, registry: Registry, runner: Runner, tokens: TokenTable
) -> tuple[Any, Any]:
    """The ``/mcp`` route handler and the lifespan that runs the SDK's session manager."""

    async def call(
        operation: Operation, arguments: dict[str, Any], ctx: ServerRequestContext
    ) -> Any:
        agent = ctx.request.scope.get(AGENT_KEY) if ctx.request is not None else None
        if not isinstance(agent, str):
            raise internal_error()  # the gate always sets it; never run a call without one
        return await runner.run(operation, arguments, agent, face="mcp")

    manager = StreamableHTTPSessionManager(
        app=build_server(registry, call),
        stateless=True,
        json_response=True,
        security_settings=security(settings),
        max_request_body_size=settings.max_body_bytes,
    )

    @asgi("/mcp", is_mount=True, copy_scope=True)
    async def mcp_endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            return
        header = _header(scope, b"authorization")
        if not header:
            await _unauthorized(send, "missing bearer token")
            return
        agent = tokens.agent_for(header)
        if agent is None:
            await _unauthorized(send, "invalid bearer token")
            return
        # An ASGI scope is a plain dict, open to extensions like ours, which litestar types as
        # a TypedDict of the standard keys only.
        if scope["method"] != "POST":
            await _answer(send, 405, POST_ONLY, [(b"allow", b"POST")])
            return
        cast("dict[str, Any]", scope)[AGENT_KEY] = agent
        # The SDK annotates the same scope and channels with Starlette's types (plain mappings).
        await manager.handle_request(scope, receive, send)  # type: ignore[arg-type]  # litestar's TypedDicts

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        async with manager.run():
            yield

    return mcp_endpoint, lifespan


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def _unauthorized(send: Send, reason: str) -> None:
    """The same answer as ``/cstp`` gives: 401, ``WWW-Authenticate: Bearer``, a JSON body."""
    body = UNAUTHORIZED % reason.encode()
    await _answer(send, 401, body, [(b"www-authenticate", b'Bearer realm="cstp"')])


async def _answer(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    """A whole JSON answer, sent before the SDK sees the request."""
    start: HTTPResponseStartEvent = {
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *headers,
        ],
    }
    await send(start)
    await send({"type": "http.response.body", "body": body, "more_body": False})  # ASGI's default
