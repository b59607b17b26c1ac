"""create_app(): the Litestar factory; serving_app(): the one ``cstp serve`` runs."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar

from .access.lookup import TokenLookup
from .approvals import expiry as approval_expiry
from .audit import chain
from .auth import LOCAL_AGENT, TokenTable, ensure_local_token, load_tokens
from .config import ConfigError, Settings
from .console.routes import build_console
from .console.routes import template_config as console_template_config
from .db.engine import trace_commits
from .mcp.http import build_mcp_mount
from .observability import calls as traced_calls
from .observability import tracing as otel
from .operations.registry import Registry
from .operations.runner import Runner
from .rpc import discover
from .rpc.dispatcher import Dispatcher
from .rpc.route import build_rpc_route
from .runtime import Runtime
from .scopes import agent_principal
from .search.embedder import Embedder
from .services import build_services
from .system import chain_verification
from .system.ci_hook import build_ci_route
from .system.metrics import metrics
from .system.routes import agent_card, health, ready
from .table import build_registry as build_operations

log = logging.getLogger("cstp")


def build_registry() -> Registry:
    """The operation table, plus the JSON-RPC face's own ``rpc.discover`` (registered last:
    its document lists every operation)."""
    registry = build_operations()
    discover.register(registry)
    return registry


def check_rate_limits(settings: Settings, registry: Registry) -> None:
    """A budget for a method that does not exist (a typo) would never be applied: refuse it."""
    unknown = sorted(set(settings.rate_limits) - {"default"} - set(registry.names()))
    if unknown:
        raise ConfigError(
            f"CSTP_RATE_LIMITS names no method of this server: {', '.join(unknown)} "
            f"(use 'default' or one of: {', '.join(registry.names())})"
        )


def resolve_tokens(settings: Settings) -> TokenTable:
    tokens = load_tokens(settings)
    if not tokens:
        token, created = ensure_local_token(settings.data_dir)
        tokens = {token: LOCAL_AGENT}
        log.warning(
            "no CSTP_AUTH_TOKENS configured: agent '%s' uses the token kept in %s%s",
            LOCAL_AGENT,
            settings.data_dir / "local-token",
            " (new)" if created else "",
        )
    table = TokenTable()
    for token, agent in tokens.items():
        table.add(token, agent_principal(agent))
    return table


def create_app(
    settings: Settings | None = None,
    *,
    runtime: Runtime | None = None,
    embedder: Embedder | None = None,
    start_relay: bool = True,
    freeze_heap: bool = False,
) -> Litestar:
    """The app. ``freeze_heap``: once started, hide what the process holds from the garbage
    collector (``serving_app``)."""
    settings = settings or Settings.from_env()
    registry = build_registry()
    check_rate_limits(settings, registry)
    tracing = otel.from_env(settings.trace_content)  # None: OTEL_* ask for no traces
    tokens = resolve_tokens(settings)
    services = build_services(settings, runtime, embedder, registry.names())
    tokens.use_database(TokenLookup(services.db, services.runtime.now))
    runner = Runner(services)  # both faces run their calls through it
    dispatcher = Dispatcher(registry, services, runner)
    mcp_endpoint, mcp_lifespan = build_mcp_mount(settings, registry, runner, tokens)
    console, console_pages, console_static = build_console(registry, runner, tokens, services)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        if tracing is not None:
            tracing.start()
            trace_commits()
            if traced_calls.committed not in chain.observers:  # a span learns its row's seq
                chain.observers.append(traced_calls.committed)
            runner.tracing = app.state.tracing = tracing
        if start_relay and settings.relay_enabled:
            services.background.append(asyncio.create_task(services.relay.loop()))
            expiring = approval_expiry.loop(services.db, services.runtime.now)
            services.background.append(asyncio.create_task(expiring))
            # Webhooks: in every server process too; leases keep one process per subscription.
            services.background.append(asyncio.create_task(services.webhooks.loop()))
        if settings.audit_verify_seconds:
            verifying = chain_verification.verify_periodically(
                settings, services.metrics, services.runtime.now
            )
            services.background.append(asyncio.create_task(verifying))
        if freeze_heap:
            # What a started server holds (the model, the index, the engines, the imported
            # code) lives as long as the process: frozen, a full collection no longer walks
            # it, and no longer stalls every call in flight (docs/performance-history.md,
            # "The collector's full collections").
            gc.collect()
            gc.freeze()
        try:
            yield
        finally:
            try:
                await services.close()
            finally:
                services.metrics.process_ended()
                if tracing is not None:
                    runner.tracing = app.state.tracing = None
                    # Flushing exports what is left: a blocking request, off the loop.
                    await asyncio.to_thread(tracing.shutdown)

    app = Litestar(
        route_handlers=[
            build_rpc_route(settings.max_body_bytes),
            build_ci_route(settings.max_body_bytes),
            mcp_endpoint,
            console_pages,
            console_static,
            health,
            ready,
            agent_card,
            metrics,
        ],
        lifespan=[lifespan, mcp_lifespan],
        debug=False,
        logging_config=None,
        # No OpenAPI pages (/schema): they would be served without a token and load their
        # scripts from a CDN; the server describes itself with OpenRPC (rpc.discover).
        openapi_config=None,
        template_config=console_template_config(),
    )
    app.state.services = services
    app.state.registry = registry
    app.state.dispatcher = dispatcher
    app.state.tokens = tokens
    app.state.console = console
    app.state.tracing = None  # the started Tracing while the app runs with tracing on
    return app


def serving_app() -> Litestar:
    """The app of a server process (uvicorn's factory in ``cstp serve``, in each worker):
    settings from the environment, the heap frozen once started. A JSON log takes Python's
    warnings as log records, in a worker process too (uvicorn sets its logging up, not this)."""
    settings = Settings.from_env()
    if settings.log_format == "json":
        logging.captureWarnings(True)
    return create_app(settings, freeze_heap=True)
