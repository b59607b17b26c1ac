"""Health, readiness and the agent card: unauthenticated routes for operators and peers."""

from __future__ import annotations

import time
from typing import Any

from litestar import Request, Response, get

from app.db import migrate
from app.outbox.admin import counts
from app.version import __version__
from app.webhooks import admin as webhooks

from . import dependencies

CSTP_PROTOCOL_VERSION = "1.0"


@get("/health", sync_to_thread=False)
def health(request: Request[Any, Any, Any]) -> dict[str, Any]:
    services = request.app.state.services
    return {
        "status": "healthy",
        "version": __version__,
        "uptimeSeconds": round(time.monotonic() - services.started_at, 3),
    }


@get("/ready")
async def ready(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    """Each part is checked on its own, so the answer names exactly what is not ready.

    503 ``not_ready`` lists in ``failing`` what keeps the server from serving calls. Dead
    outbox events do not: 200 with ``status: "degraded"`` and ``degraded: ["outbox"]``
    (``checks.outbox.dead`` counts them). A dead event is one decision whose YAML file or
    index entry can never be made as it stands; every replica shares that table, so taking
    one out of rotation would not help, and taking all out would stop every call for one
    undeliverable decision. Dead webhook deliveries (a receiver refused them) are the same:
    ``degraded: ["webhooks"]``, counted in ``checks.webhooks``. Monitoring should alert on any
    status but ``ready``."""
    services = request.app.state.services
    checks: dict[str, Any] = {}
    failing: list[str] = []
    degraded: list[str] = []
    if await dependencies.database_answers(services):
        checks["database"] = "ok"
    else:
        checks["database"] = "unreachable"
        failing.append("database")
    if "database" not in failing:
        try:
            current = await services.db.schema_revision()
            head = migrate.head_revision()
            checks["schema"] = "ok" if current == head else f"at {current}, expected {head}"
            if current != head:
                failing.append("schema")
        except Exception:
            checks["schema"] = "unknown"
            failing.append("schema")
        try:
            checks["outbox"] = await counts(services)
            if checks["outbox"]["dead"]:
                degraded.append("outbox")
        except Exception:
            checks["outbox"] = "unknown"
        try:
            # Webhook deliveries, as outbox events: dead ones (refused by their receiver)
            # degrade; pending ones wait for a receiver, which is no reason to leave rotation.
            checks["webhooks"] = await webhooks.counts(services.db)
            if checks["webhooks"]["dead"]:
                degraded.append("webhooks")
        except Exception:
            checks["webhooks"] = "unknown"
    if await dependencies.index_answers(services):
        checks["vectorIndex"] = "ok"
    else:
        checks["vectorIndex"] = "unreachable"
        failing.append("vectorIndex")
    limits = await dependencies.rate_limit_store(services)
    if limits is not None:
        # Every call is refused (-32006) while its budget cannot be updated, whether the
        # store is down or answers but refuses writes: not ready either way.
        checks["rateLimits"] = limits
        if limits != "ok":
            failing.append("rateLimits")
    status = "not_ready" if failing else "degraded" if degraded else "ready"
    body: dict[str, Any] = {"status": status, "checks": checks}
    if failing:
        body["failing"] = failing
    if degraded:
        body["degraded"] = degraded
    return Response(body, status_code=200 if not failing else 503)


@get("/.well-known/agent.json", sync_to_thread=False)
def agent_card(request: Request[Any, Any, Any]) -> dict[str, Any]:
    state = request.app.state
    settings = state.services.settings
    base = f"{request.url.scheme}://{request.url.netloc}"
    return {
        "name": settings.agent_name,
        "description": (
            "CSTP decision memory and guardrail service: announce an intent, get similar past "
            "decisions with their outcomes, guardrail verdicts and suggestions."
        ),
        "version": __version__,
        "url": f"{base}/cstp",
        "capabilities": {
            "cstp": {"version": CSTP_PROTOCOL_VERSION, "methods": state.registry.names()},
        },
        "authentication": {"schemes": ["bearer"]},
    }
