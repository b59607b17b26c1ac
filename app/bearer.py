"""The bearer check of the HTTP routes that take a token (``POST /cstp``, ``GET /metrics``):
who the ``Authorization`` header lets in, or the answer that refuses the request, before its
body is read. (``/mcp`` answers the same at the ASGI level, app.mcp.http.)"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response

from app.access.lookup import TokenStoreUnavailable
from app.scopes import Principal

JSON = "application/json"
UNAVAILABLE = (
    b'{"error":"unavailable","message":"the token store cannot be read: try again shortly"}'
)


def unauthorized(reason: str) -> Response[bytes]:
    body = b'{"error":"unauthorized","message":"' + reason.encode() + b'"}'
    return Response(
        body,
        status_code=401,
        media_type=JSON,
        headers={"WWW-Authenticate": 'Bearer realm="cstp"'},
    )


async def authenticate(request: Request[Any, Any, Any]) -> Principal | Response[bytes]:
    """The principal the request's bearer token names, or the response to send instead: 401
    for a missing or unknown (revoked, expired) token, 503 when the token could only be in
    the database and the database cannot be read."""
    header = request.headers.get("authorization")
    if not header:
        return unauthorized("missing bearer token")
    try:
        principal: Principal | None = await request.app.state.tokens.principal_for(header)
    except TokenStoreUnavailable:
        return Response(UNAVAILABLE, status_code=503, media_type=JSON, headers={"Retry-After": "1"})
    if principal is None:
        return unauthorized("invalid bearer token")
    return principal
