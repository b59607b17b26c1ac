"""``GET /metrics``: the Prometheus text format, for a token with the ``metrics`` scope (role
``monitor``: ``cstp tokens create --agent prom --role monitor``).

The same bearer check as ``/cstp`` (401 without a valid token, 503 when the token store
cannot be read), then 403 for a token without the scope. The series are the server's, not a
workspace's: they carry no workspace, agent or id (app.observability).
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.bearer import JSON, authenticate
from app.observability.metrics import Families, Scrape
from app.scopes import METRICS

from . import scrape

FORBIDDEN = b'{"error":"forbidden","message":"GET /metrics needs a token with scope metrics"}'


@get("/metrics")
async def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    principal = await authenticate(request)
    if isinstance(principal, Response):
        return principal
    if not principal.may(METRICS):
        return Response(FORBIDDEN, status_code=403, media_type=JSON)
    services = request.app.state.services
    found = Families(await scrape.families(services))
    body = generate_latest(Scrape([*services.metrics.collectors(), found]))
    return Response(body, status_code=200, media_type=CONTENT_TYPE_LATEST)
