"""``POST /cstp``: bearer auth before the body is read, a capped body, then the dispatcher."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post
from litestar.exceptions import ClientException
from litestar.handlers import HTTPRouteHandler

from app.access.lookup import TokenStoreUnavailable
from app.observability.tracing import Tracing

from .dispatcher import Dispatcher

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


def build_rpc_route(max_body_bytes: int) -> HTTPRouteHandler:
    @post("/cstp", request_max_body_size=max_body_bytes, status_code=200)
    async def cstp(request: Request[Any, Any, Any]) -> Response[bytes]:
        state = request.app.state
        header = request.headers.get("authorization")
        if not header:
            return unauthorized("missing bearer token")
        try:
            principal = await state.tokens.principal_for(header)
        except TokenStoreUnavailable:
            return Response(
                UNAVAILABLE, status_code=503, media_type=JSON, headers={"Retry-After": "1"}
            )
        if principal is None:
            return unauthorized("invalid bearer token")
        try:
            body = await request.body()
        except ClientException as exc:
            if exc.status_code == 413:
                message = b'{"error":"payload_too_large","message":"request body is too large"}'
                return Response(message, status_code=413, media_type=JSON)
            raise
        dispatcher: Dispatcher = state.dispatcher
        tracing: Tracing | None = state.tracing
        if tracing is None:
            answer = await dispatcher.handle(body, principal)
        else:  # the calls continue the caller's trace (a traceparent header)
            with tracing.continued(request.headers):
                answer = await dispatcher.handle(body, principal)
        if answer is None:
            return Response(b"", status_code=204)
        return Response(answer, status_code=200, media_type=JSON)

    return cstp
