"""Whether each outside part the server needs answers now: the database, the vector index,
and the shared rate-limit store (Redis) when one is configured. Asked by ``GET /ready`` and
by each scrape of ``GET /metrics`` (``cstp_dependency_up``), so the two never disagree."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.services import Services


async def database_answers(services: Services) -> bool:
    """A read of the database succeeds (a failure of any kind is "no": that is the answer,
    and the caller reports it)."""
    try:
        await services.db.ping()
    except Exception:
        return False
    return True


async def index_answers(services: Services) -> bool:
    """The vector index's collection answers."""
    try:
        await services.index.ping()
    except Exception:
        return False
    return True


async def rate_limit_store(services: Services) -> str | None:
    """The shared rate-limit store's state: ``"ok"``, what is wrong with it (every call is
    refused with -32006 while it is not ok, whether it is down or refuses writes), or
    ``"unknown"`` when asking failed; None when the limits are kept in memory."""
    readiness = getattr(services.limiter, "readiness", None)  # a shared store only
    if readiness is None:
        return None
    try:
        state: str = await readiness()
    except Exception:
        return "unknown"
    return state
