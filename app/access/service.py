"""Creating, listing and revoking tokens (``cstp tokens``, app.cli.tokens).

A creation writes the token row and its ``create`` grant, a revocation sets ``revoked_at``
and writes a ``revoke`` grant; each grant is appended to the audit chain in the same
transaction (app.audit.chain), so a token never exists, or stops, without its audit row.
The secret is made here, returned once to the caller, and only its SHA-256 is stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from app.audit.chain import append
from app.db.engine import Database
from app.db.tokens import CREATE, REVOKE, ApiToken, ApiTokenGrant
from app.runtime import Runtime

from . import repository
from .rules import TokenRequest, effective_scopes, new_id, new_secret, secret_digest


@dataclass(frozen=True)
class Created:
    """A new token; ``secret`` exists nowhere else (show it once, then forget it)."""

    token: ApiToken
    secret: str

    def __repr__(self) -> str:  # never the secret, should a Created reach a log line
        return f"Created(id={self.token.id!r})"


@dataclass(frozen=True)
class Revoked:
    token: ApiToken
    now: bool  # False: it had been revoked before (at ``token.revoked_at``)


class UnknownToken(LookupError):
    """No token has this id."""


def status(token: ApiToken, now: datetime) -> str:
    """``revoked``, ``expired`` or ``active``, as the server would judge it ``now``."""
    if token.revoked_at is not None:
        return "revoked"
    if token.expires_at is not None and token.expires_at <= now:
        return "expired"
    return "active"


def _grant(token: ApiToken, action: str, at: datetime, by: str, grant_id: str) -> ApiTokenGrant:
    return ApiTokenGrant(
        id=grant_id,
        token_id=token.id,
        workspace=token.workspace,
        action=action,
        agent=token.agent,
        role=token.role,
        scopes=list(token.scopes),
        expires_at=token.expires_at,
        secret_sha256=token.secret_sha256,
        acted_at=at,
        acted_by=by,
    )


class TokenAdmin:
    """The tokens of one database; ``by`` in each call names who acts (``created_by``)."""

    def __init__(self, db: Database, runtime: Runtime | None = None) -> None:
        self.db = db
        self.runtime = runtime or Runtime()

    async def create(self, request: TokenRequest, by: str) -> Created:
        now = self.runtime.now()
        secret = new_secret()
        token = ApiToken(
            id=new_id(),
            workspace=request.workspace,
            agent=request.agent,
            role=request.role,
            scopes=effective_scopes(request),
            created_at=now,
            created_by=by,
            expires_at=now + request.lifetime if request.lifetime is not None else None,
            revoked_at=None,
            secret_sha256=secret_digest(secret).hex(),
        )
        async with self.db.transaction() as session:
            await repository.add_token(session, token)
            grant = _grant(token, CREATE, now, by, self.runtime.uuid())
            await repository.add_grant(session, grant)
            append(session, grant)
        return Created(token, secret)

    async def revoke(self, token_id: str, by: str) -> Revoked:
        """Revoke the token (``UnknownToken`` when no token has this id); revoking it again
        changes nothing and says when it was."""
        now = self.runtime.now()
        async with self.db.transaction() as session:
            revoked_now = await repository.set_revoked(session, token_id, now)
            token = await repository.token(session, token_id)
            if token is None:
                raise UnknownToken(token_id)
            if revoked_now:
                grant = _grant(token, REVOKE, now, by, self.runtime.uuid())
                await repository.add_grant(session, grant)
                append(session, grant)
        return Revoked(token, revoked_now)

    async def list(self, workspace: str | None = None) -> Sequence[ApiToken]:
        async with self.db.transaction(write=False) as session:
            return await repository.tokens(session, workspace)
