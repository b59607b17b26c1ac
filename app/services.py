"""The service container: everything a handler may use, built once per app."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from .audit.chain import use_key
from .config import Settings
from .db import models as _all_models  # noqa: F401 - every table known before any flush
from .db.engine import Database
from .decisions.export import decision_exports
from .decisions.writer import RecordWriter
from .guardrails.rule_files import load_rules, rule_dirs
from .guardrails.rules import RuleSet
from .intents.writer import IntentWriter
from .observability.metrics import Metrics
from .operations.ratelimit import MemoryRateLimiter, RateLimiter, RedisRateLimiter
from .outbox.relay import Relay
from .runtime import Calls, Runtime
from .search.embedder import Embedder, load_default_embedder
from .search.index import VectorIndex
from .webhooks.delivery import WebhookRelay

log = logging.getLogger("cstp")


@dataclass
class Services:
    settings: Settings
    runtime: Runtime
    db: Database
    limiter: RateLimiter
    rules: RuleSet
    index: VectorIndex
    relay: Relay
    recorder: RecordWriter
    announcer: IntentWriter  # announcements' audit rows, committed in batches
    calls: Calls  # the calls in flight; the embedder reads them (``crowded``)
    webhooks: WebhookRelay  # the webhook delivery loop (started by the app's lifespan)
    metrics: Metrics  # the instruments of GET /metrics (app.observability)
    started_at: float = field(default_factory=time.monotonic)
    background: list[asyncio.Task[None]] = field(default_factory=list)

    async def close(self) -> None:
        for task in self.background:
            task.cancel()
        for task in self.background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.background.clear()
        await self.webhooks.close()
        await self.recorder.drain()
        await self.announcer.drain()
        await self.relay.flush()
        await self.limiter.close()
        await self.index.aclose()
        await self.db.dispose()


def build_services(
    settings: Settings,
    runtime: Runtime | None = None,
    embedder: Embedder | None = None,
    methods: Iterable[str] = (),
) -> Services:
    """Build without I/O beyond reading the rule files (which must fail at start-up).
    ``methods``: the operations whose duration histograms exist from the start."""
    runtime = runtime or Runtime()
    rules = load_rules(rule_dirs(settings.guardrails_dir))
    limiter: RateLimiter
    if settings.redis_url:
        limiter = RedisRateLimiter(settings.redis_url, settings.rate_limits)
    else:
        limiter = MemoryRateLimiter(settings.rate_limits)
    calls = Calls()
    if embedder is None:
        embedder = load_default_embedder(crowded=calls.crowded)
    if settings.chroma_url:
        index = VectorIndex.http(settings.chroma_url, embedder)
    else:
        index = VectorIndex.embedded(settings.data_dir / "chroma", embedder)
    db = Database(settings.database_url)
    use_key(db.write_engine, settings.audit_key)  # the audit chain's entries (docs/AUDIT.md)
    relay = Relay(db, index, settings, runtime, exports=decision_exports())
    recorder = RecordWriter(db, relay, runtime)
    announcer = IntentWriter(db)
    webhooks = WebhookRelay(db, settings, runtime)
    metrics = Metrics(methods)
    return Services(
        settings,
        runtime,
        db,
        limiter,
        rules,
        index,
        relay,
        recorder,
        announcer,
        calls,
        webhooks,
        metrics,
    )
