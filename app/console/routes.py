"""The console (SPEC.md, section 10): server-rendered pages for the people around the
agents, on the same server, tokens and scopes.

Jinja templates with autoescaping render every page; no page runs a script (the
Content-Security-Policy allows none) and forms are plain HTML forms, so reading and acting both
work without JavaScript. Every action is a call through the operation runner
(app.console.core).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from litestar import Router
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.static_files import create_static_files_router
from litestar.template.config import TemplateConfig

from app.observability.tracing import continue_traces
from app.runtime import iso

from . import auth, decisions, oversight
from .core import Console, NotSignedIn, Refused, not_signed_in, show_refusal
from .sessions import SessionStore

if TYPE_CHECKING:
    from litestar.types import ASGIApp, Message, Receive, Scope, Send

    from app.auth import TokenTable
    from app.operations.registry import Registry
    from app.operations.runner import Runner
    from app.services import Services

HERE = Path(__file__).parent

# No script from anywhere, styles from this server only, no framing, forms posted only here.
POLICY = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = [
    (b"content-security-policy", POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]


def guarded(app: ASGIApp) -> ASGIApp:
    """Every answer under /console carries HEADERS: pages, redirects, error pages and the
    stylesheet alike. (A router's ``response_headers`` reach only what a handler returns,
    not the answer an exception handler renders.)"""

    async def send_guarded(scope: Scope, receive: Receive, send: Send) -> None:
        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [h for h in message.get("headers", []) if h[0].lower() not in NAMES]
                message["headers"] = [*kept, *HEADERS]
            await send(message)

        await app(scope, receive, sending)

    return send_guarded


NAMES = {name for name, _ in HEADERS}


def _when(value: object) -> str:
    """A stored time as the wire writes times (ISO 8601, UTC, ``Z``)."""
    return iso(value) if isinstance(value, datetime) else str(value)


def _value(value: object) -> str:
    """A free-form value (an approval's action fields) as JSON, not Python's repr."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _filters(engine: JinjaTemplateEngine) -> None:
    engine.engine.filters.update(when=_when, value=_value)


def template_config() -> TemplateConfig[JinjaTemplateEngine]:
    return TemplateConfig(
        directory=HERE / "templates", engine=JinjaTemplateEngine, engine_callback=_filters
    )


def build_console(
    registry: Registry, runner: Runner, tokens: TokenTable, services: Services
) -> tuple[Console, Router, Router]:
    """The console's state, its pages and its stylesheet (under /console)."""
    console = Console(registry, runner, tokens, services, SessionStore(services.db))
    pages = Router(
        path="/console",
        route_handlers=[
            auth.home,
            auth.login_form,
            auth.sign_in,
            auth.sign_out,
            decisions.decisions,
            decisions.decision,
            decisions.review,
            decisions.replay_evaluation,
            oversight.approvals,
            oversight.decide,
            oversight.ready,
            oversight.calibration_page,
            oversight.guardrails,
            oversight.audit,
            oversight.verify_chain,
        ],
        exception_handlers={NotSignedIn: not_signed_in, Refused: show_refusal},
        # Forms are held to the API's body cap; their fields to the API's limits (the runner
        # validates every call's params).
        request_max_body_size=services.settings.max_body_bytes,
        include_in_schema=False,
        # every answer guarded; a page's calls continue a caller's traceparent
        middleware=[guarded, continue_traces],
    )
    static = create_static_files_router(
        path="/console/static", directories=[HERE / "static"], middleware=[guarded]
    )
    return console, pages, static
