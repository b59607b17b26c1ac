"""``/mcp``: the MCP face over Streamable HTTP, in the same Litestar app as ``/cstp``.

As strict as ``/cstp``: the same bearer tokens (HTTP 401 before the SDK sees the request),
the agent always the token's, the same body cap, and every tool call run by the same runner
(the same rate limits, transactions and audit rows). The SDK's session manager runs
stateless with JSON responses: no session lives in one process, so any worker can answer any
request. DNS-rebinding protection: only the Host names of ``CSTP_MCP_ALLOWED_HOSTS``
(default: this machine's loopback names and ``CSTP_HOST``) are served; others get HTTP 421,
and a browser's Origin naming another host 403, from the gate before the SDK sees the
request (``Hosts``).

Only POST is served. A stateless server has nothing to send on a stream of its own, yet the
SDK would hold a GET open for ever (a socket and its memory per request); the MCP
specification lets a server that offers no such stream answer 405, which the SDK's client
takes in its stride. DELETE (ending a session) means nothing without sessions either.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, cast

from litestar import Litestar, asgi
from litestar.enums import ScopeType
from litestar.types import HTTPResponseStartEvent, Receive, Scope, Send
from mcp.server import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from app.access.lookup import TokenStoreUnavailable
from app.errors import internal_error
from app.operations.registry import Operation, Registry
from app.operations.runner import Runner
from app.scopes import Principal

from .tools import build_server

if TYPE_CHECKING:
    from app.auth import TokenTable
    from app.config import Settings

PRINCIPAL_KEY = "cstp.principal"  # where the gate leaves the token's principal (ASGI scope)
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
UNAUTHORIZED = b'{"error":"unauthorized","message":"%s"}'
TOKENS_UNAVAILABLE = (
    b'{"error":"unavailable","message":"the token store cannot be read: try again shortly"}'
)
WRONG_HOST = b'{"error":"misdirected_request","message":"/mcp does not serve this Host"}'
WRONG_ORIGIN = b'{"error":"forbidden","message":"/mcp does not serve this Origin"}'
POST_ONLY = (
    b'{"error":"method_not_allowed","message":"/mcp takes POST only: '
    b'this stateless server offers no stream"}'
)

# The SDK's transport logs every stateless request's end at INFO ("Terminating session:
# None"), and its session manager its own start and stop: nothing an operator acts on.
logging.getLogger("mcp.server.streamable_http").setLevel(logging.WARNING)
logging.getLogger("mcp.server.streamable_http_manager").setLevel(logging.WARNING)


class Hosts:
    """The Host names ``/mcp`` serves (DNS-rebinding protection), checked here rather than by
    the SDK, whose ``name:*`` patterns take anything after ``name:`` (``localhost:abc``,
    ``127.0.0.1:9401@evil.com``). A Host is ``name`` or ``name:port``, the port digits only;
    names compare in any case."""

    def __init__(self, entries: Iterable[str]) -> None:
        self.any_port: set[str] = set()
        self.exact: set[tuple[str, str]] = set()
        for entry in entries:
            wildcard = entry.endswith(":*")
            parsed = _name_and_port(entry[:-2] if wildcard else entry)
            if parsed is None:
                continue  # not a name a client can send: it serves nothing
            name, port = parsed
            if port is None:
                self.any_port.add(name)
            else:
                self.exact.add((name, port))

    def serves(self, host: str | None) -> bool:
        parsed = _name_and_port(host or "")
        if parsed is None:
            return False
        name, port = parsed
        return name in self.any_port or (port is not None and (name, port) in self.exact)

    def allows_origin(self, origin: str | None) -> bool:
        """No Origin (not a browser, or the same origin) or ``http(s)://`` a served Host."""
        if origin is None:
            return True
        scheme, sep, rest = origin.partition("://")
        return bool(sep) and scheme.lower() in ("http", "https") and self.serves(rest)


_PORT = re.compile(r"[0-9]{1,5}")


def _name_and_port(value: str) -> tuple[str, str | None] | None:
    """``value`` as (name in lower case, port or None); None when it is not ``name``,
    ``name:port``, ``[v6]`` or ``[v6]:port`` with a port of digits."""
    if value.startswith("["):
        address, bracket, rest = value.partition("]")
        name = address + bracket
        if not bracket:
            return None
    else:
        name, colon, port = value.partition(":")
        rest = colon + port
    if not name:
        return None
    if not rest:
        return name.lower(), None
    if rest[0] != ":" or not _PORT.fullmatch(rest[1:]):
        return None
    return name.lower(), rest[1:]


def allowed_hosts(settings: Settings) -> Hosts | None:
    """The Host names to serve (a name listed without a port, or with ``:*``, on any port);
    None: any host."""
    if "*" in settings.mcp_allowed_hosts:
        return None
    names = settings.mcp_allowed_hosts or (*LOOPBACK, settings.host)
    # 0.0.0.0 and :: are bind addresses, not names a client sends.
    return Hosts(name for name in names if name not in ("0.0.0.0", "::"))


def build_mcp_mount(
    settings: Settings, registry: Registry, runner: Runner, tokens: TokenTable
) -> tuple[Any, Any]:
    """The ``/mcp`` route handler and the lifespan that runs the SDK's session manager."""

    async def call(
        operation: Operation[Any, Any], arguments: dict[str, Any], ctx: ServerRequestContext
    ) -> Any:
        principal = _principal(ctx)
        if principal is None:
            raise internal_error()  # the gate always sets it; never run a call without one
        tracing = runner.tracing
        if tracing is None or not ctx.meta:
            return await runner.run(operation, arguments, principal, face="mcp")
        with tracing.continued(ctx.meta):  # the caller's trace: ``_meta.traceparent``
            return await runner.run(operation, arguments, principal, face="mcp")

    def scopes(ctx: ServerRequestContext) -> frozenset[str] | None:
        principal = _principal(ctx)
        return None if principal is None else principal.scopes

    hosts = allowed_hosts(settings)
    manager = StreamableHTTPSessionManager(
        app=build_server(registry, call, scopes),
        stateless=True,
        json_response=True,
        # Host and Origin are checked by the gate below, more strictly than the SDK would.
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
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
        try:
            principal = await tokens.principal_for(header)
        except TokenStoreUnavailable:
            await _answer(send, 503, TOKENS_UNAVAILABLE, [(b"retry-after", b"1")])
            return
        if principal is None:
            await _unauthorized(send, "invalid bearer token")
            return
        if hosts is not None:
            if not hosts.serves(_header(scope, b"host")):
                await _answer(send, 421, WRONG_HOST, [])
                return
            if not hosts.allows_origin(_header(scope, b"origin")):
                await _answer(send, 403, WRONG_ORIGIN, [])
                return
        if scope["method"] != "POST":
            await _answer(send, 405, POST_ONLY, [(b"allow", b"POST")])
            return
        # An ASGI scope is a plain dict, open to extensions like ours, which litestar types as
        # a TypedDict of the standard keys only.
        cast("dict[str, Any]", scope)[PRINCIPAL_KEY] = principal
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


def _principal(ctx: ServerRequestContext) -> Principal | None:
    """The principal the gate found for this request's token."""
    principal = ctx.request.scope.get(PRINCIPAL_KEY) if ctx.request is not None else None
    return principal if isinstance(principal, Principal) else None
