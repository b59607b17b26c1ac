"""The series read at scrape time: what the database holds (outbox events, webhook
deliveries, approvals, the chain's head) and whether each dependency answers.

They are computed by the one process that answers the scrape, in that request, and exported
as plain gauges of this scrape alone: with several server processes, nothing of them is
written to the shared files, so nothing is added up across processes. A read that fails is
logged and its series left out of that scrape (``cstp_dependency_up`` says when the database
itself is down, and then none is read).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from app.approvals import service as approvals
from app.audit import live
from app.outbox import admin as outbox
from app.webhooks import admin as webhooks

from . import dependencies

if TYPE_CHECKING:
    from app.services import Services

log = logging.getLogger("cstp.metrics")


async def families(services: Services) -> list[Metric]:
    """This scrape's gauges."""
    up = GaugeMetricFamily(
        "cstp_dependency_up",
        "Whether a dependency answers now (1) or not (0): database, index (the vector "
        "index), redis (the shared rate-limit store, when configured)",
        labels=["dependency"],
    )
    database = await dependencies.database_answers(services)
    up.add_metric(["database"], float(database))
    up.add_metric(["index"], float(await dependencies.index_answers(services)))
    limits = await dependencies.rate_limit_store(services)
    if limits is not None:
        up.add_metric(["redis"], float(limits == "ok"))
    interval = GaugeMetricFamily(
        "cstp_audit_chain_verify_interval_seconds",
        "How often a server process verifies the whole audit chain "
        "(CSTP_AUDIT_VERIFY_INTERVAL); 0: never, so no verification is to be expected",
        value=services.settings.audit_verify_seconds,
    )
    found: list[Metric] = [up, interval]
    if database:
        for read in (_outbox, _webhooks, _approvals, _chain_head):
            family = await _read(read, services)
            if family is not None:
                found.append(family)
    return found


async def _read(read: Callable[[Services], Awaitable[Metric]], services: Services) -> Metric | None:
    try:
        return await read(services)
    except Exception:
        log.exception("metrics: %s could not be read", read.__name__.strip("_"))
        return None


async def _outbox(services: Services) -> Metric:
    family = GaugeMetricFamily(
        "cstp_outbox_events",
        "Outbox events by kind (export, index) and status (pending, done, dead), as "
        "`cstp outbox` counts them",
        labels=["kind", "status"],
    )
    for (kind, status), n in sorted((await outbox.counts_by_kind(services)).items()):
        family.add_metric([kind, status], n)
    return family


async def _webhooks(services: Services) -> Metric:
    family = GaugeMetricFamily(
        "cstp_webhook_deliveries",
        "Webhook deliveries of active subscriptions waiting (pending) or refused for good "
        "(dead), as /ready and `cstp outbox` count them",
        labels=["status"],
    )
    found = await webhooks.counts(services.db)
    family.add_metric(["pending"], found["pending"])
    family.add_metric(["dead"], found["dead"])
    return family


async def _approvals(services: Services) -> Metric:
    family = GaugeMetricFamily(
        "cstp_approvals",
        "Approvals by status now (pending, approved, denied, expired: a pending one past "
        "its deadline counts as expired)",
        labels=["status"],
    )
    for status, n in (await approvals.counts(services.db, services.runtime.now())).items():
        family.add_metric([status], n)
    return family


async def _chain_head(services: Services) -> Metric:
    return GaugeMetricFamily(
        "cstp_audit_chain_head_seq",
        "The sequence number of the audit chain's last entry",
        value=await live.head_seq(services.db),
    )


READS: tuple[tuple[str, Callable[[Services], Awaitable[Metric]]], ...] = (
    ("outbox events", _outbox),
    ("webhook deliveries", _webhooks),
    ("approvals", _approvals),
    ("audit chain's head", _chain_head),
)
