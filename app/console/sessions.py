"""Console sign-in (SPEC.md, section 10): a token in, a session cookie out.

The cookie holds a random secret; the database row (app.db.console) is keyed by its SHA-256
and holds the SHA-256 of the token, so neither the table nor a page ever holds a secret. Every
request looks the session up and its token again: signing out, the session's expiry, or the
token's revocation or expiry ends it in every server process (the token lookup's cache is at
most a second old: app.access.lookup).

Every form of a session carries the session's CSRF token (the synchronizer-token pattern);
the sign-in form, before any session exists, carries a value that must match a cookie of its
own (double submit), so no other site can sign a browser in under someone else's token.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from app.db.console import ConsoleSession
from app.db.engine import Database
from app.scopes import Principal

from . import repository

SESSION_COOKIE = "cstp_session"
LOGIN_COOKIE = "cstp_login"
#: How long a sign-in lasts; signing in again starts a new one.
SESSION_LIFETIME = timedelta(hours=8)
#: Ended and expired rows are kept this long, then deleted at a later sign-in.
KEEP_ENDED = timedelta(days=7)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def same(presented: str | None, expected: str) -> bool:
    """Whether a form's CSRF value is the expected one (in constant time)."""
    if not presented:
        return False
    return hmac.compare_digest(presented.encode(), expected.encode())


@dataclass(frozen=True)
class Person:
    """Who is signed in: the token's principal, and the session's CSRF token."""

    principal: Principal
    csrf: str
    session_id: str  # the row's key (the cookie's SHA-256), never the cookie itself


@dataclass(frozen=True)
class Session:
    """A live session as read: which token signed in, and its forms' CSRF token."""

    id: str
    token_digest: bytes
    csrf: str


class SessionStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def start(self, principal: Principal, token_digest: bytes, now: datetime) -> str:
        """A new session for the token whose SHA-256 is ``token_digest``: the cookie value
        (shown to the browser only, never stored)."""
        cookie = new_secret()
        row = ConsoleSession(
            id=_digest(cookie),
            workspace=principal.workspace,
            agent=principal.agent,
            token_digest=token_digest.hex(),
            csrf=new_secret(),
            created_at=now,
            expires_at=now + SESSION_LIFETIME,
        )
        await repository.add_session(self.db, row, forget_before=now - KEEP_ENDED)
        return cookie

    async def find(self, cookie: str | None, now: datetime) -> Session | None:
        """The live session of ``cookie``; None when there is none (unknown, signed out or
        expired)."""
        if not cookie or len(cookie) > 128:
            return None
        row = await repository.session(self.db, _digest(cookie))
        if row is None or row.ended_at is not None or row.expires_at <= now:
            return None
        return Session(row.id, bytes.fromhex(row.token_digest), row.csrf)

    async def end(self, session_id: str, now: datetime) -> None:
        await repository.end_session(self.db, session_id, now)
