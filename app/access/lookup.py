"""The server's look-up of a bearer token in the database, behind a short per-process cache.

A presented secret is looked up by its SHA-256 (``api_tokens.secret_sha256``, unique); the
configuration's tokens (app.auth) are tried first, in memory, and never reach this.

How the cache is invalidated: it is not, by anyone: every entry simply dies ``TTL`` (1 s)
after the moment its read *began*, and the next call with that token reads the database
again. A revocation committed at time T is therefore refused by every server process from
T + 1 s on (an entry whose read began before T lives until at most T + 1 s; a read that
began after T sees the commit), with no message between processes and no restart. Expiry
needs no read at all: every call compares the cached ``expires_at`` with the clock.

What is cached: the principal of a usable token, or "no such token" (a secret no token has,
or one revoked, or one refused because its row disagrees with its grants). Both caches are
bounded (``MAX_ENTRIES`` each; the oldest entry goes first), so a flood of random secrets
cannot grow memory, nor push the real tokens out. Each distinct unknown secret costs one
indexed read per second at most; concurrent calls with the same secret share one read, and
at most ``MAX_READS`` reads run at once per process, so such a flood queues here instead of
taking the database's connections.

A token is usable when its row is not revoked and agrees with its grants (app.audit.grants:
no ``revoked_at`` cleared or scopes widened by SQL), the grant of its creation is covered by
the audit chain, and its role and scopes are ones this server knows. A row refused for any
reason but revocation is logged (its id, never its secret).

The database out of reach is ``TokenStoreUnavailable`` (the faces answer 503), never a
refusal: a client told 401 would drop a token that is still good.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from app.audit.grants import StoredToken, stored_token
from app.db.engine import Database
from app.scopes import ROLES, SCOPES, Principal

log = logging.getLogger("cstp.tokens")

TTL = 1.0  # seconds an entry lives after its read began
MAX_ENTRIES = 10_000  # per cache: usable tokens, and secrets that let no one in
MAX_READS = 4  # reads of the token table running at once, per process


class TokenStoreUnavailable(Exception):
    """The token table could not be read: the call can be neither let in nor refused."""


@dataclass(frozen=True)
class _Entry:
    read_at: float  # monotonic time the read began
    principal: Principal | None  # None: lets no one in
    expires_at: datetime | None = None


def _entry(found: StoredToken | None, read_at: float) -> _Entry:
    """What a read found: the principal of a usable token (with its expiry), or no one."""
    if found is None:
        return _Entry(read_at, None)
    token, why = found.values, found.refusal
    if token is not None and why is None:
        if token["revoked_at"] is not None:
            return _Entry(read_at, None)
        if not _known(token["role"], token["scopes"]):
            why = "its role or scopes are not ones this server knows"
    if token is None or why is not None:
        log.warning("token %s refused: %s", found.id, why)
        return _Entry(read_at, None)
    principal = Principal(
        agent=str(token["agent"]),
        workspace=str(token["workspace"]),
        role=str(token["role"]),
        scopes=frozenset(token["scopes"]),
    )
    return _Entry(read_at, principal, token["expires_at"])


def _known(role: Any, scopes: Any) -> bool:
    return (
        role in ROLES
        and isinstance(scopes, list)
        and all(isinstance(s, str) and s in SCOPES for s in scopes)
    )


class TokenLookup:
    """Tokens of the database, by the SHA-256 of their secret (see the module docstring)."""

    def __init__(
        self,
        db: Database,
        now: Callable[[], datetime],
        *,
        ttl: float = TTL,
        max_entries: int = MAX_ENTRIES,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        self.now = now  # the wall clock expiry is judged by (the services' Runtime)
        self.ttl = ttl
        self.max_entries = max_entries
        self.monotonic = monotonic
        self._usable: dict[bytes, _Entry] = {}
        self._unusable: dict[bytes, _Entry] = {}
        self._reading: dict[bytes, asyncio.Future[_Entry]] = {}
        self._reads = asyncio.Semaphore(MAX_READS)

    @property
    def sizes(self) -> tuple[int, int]:
        """How many entries each cache holds: (usable tokens, secrets that let no one in)."""
        return len(self._usable), len(self._unusable)

    async def principal(self, digest: bytes) -> Principal | None:
        """Who the secret with this SHA-256 lets in now; None: no one."""
        entry = self._usable.get(digest) or self._unusable.get(digest)
        if entry is None or self.monotonic() - entry.read_at >= self.ttl:
            entry = await self._read_shared(digest)
        if entry.principal is None:
            return None
        if entry.expires_at is not None and entry.expires_at <= self.now():
            return None
        return entry.principal

    async def _read_shared(self, digest: bytes) -> _Entry:
        """One read per secret at a time: calls arriving during a read share its result."""
        pending = self._reading.get(digest)
        if pending is None:
            pending = asyncio.ensure_future(self._read(digest))
            self._reading[digest] = pending
            pending.add_done_callback(lambda _: self._reading.pop(digest, None))
        # shielded: a caller that goes away does not cancel the others' read
        return await asyncio.shield(pending)

    async def _read(self, digest: bytes) -> _Entry:
        async with self._reads:
            began = self.monotonic()
            try:
                found = await self.db.read(lambda conn: stored_token(conn, digest.hex()))
            except (SQLAlchemyError, OSError) as exc:
                log.error("the token table cannot be read: %s", type(exc).__name__)
                raise TokenStoreUnavailable from None
        entry = _entry(found, began)
        self._keep(digest, entry)
        return entry

    def _keep(self, digest: bytes, entry: _Entry) -> None:
        """Into its cache (and out of the other), the oldest entry making room."""
        cache, other = (
            (self._usable, self._unusable)
            if entry.principal is not None
            else (self._unusable, self._usable)
        )
        other.pop(digest, None)
        cache.pop(digest, None)  # re-inserted: now the newest
        if len(cache) >= self.max_entries:
            cache.pop(next(iter(cache)))
        cache[digest] = entry
