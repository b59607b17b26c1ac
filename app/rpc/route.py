"""``POST /cstp``: bearer auth before the body is read, a capped body, then the dispatcher."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post
from litestar.exceptions import ClientException
from litestar.handlers import HTTPRouteHandler

from app.bearer import JSON, authenticate
from app.observability.tracing import Tracing

from .dispatcher import Dispatcher


def build_rpc_route(max_body_bytes: int) -> HTTPRouteHandler:
    @post("/cstp", request_max_body_size=max_body_bytes, status_code=200)
    async def cstp(request: Request[Any, Any, Any]) -> Response[bytes]:
        state = request.app.state
        principal = await authenticate(request)
        if isinstance(principal, Response):
            return principal
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
