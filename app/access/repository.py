"""The SQL of the tokens: inserting a token and its grants, revoking, listing. (The server's
look-up by the SHA-256 of a secret reads the token with its grants, through the audit
context that checks one against the other: app.audit.grants.stored_token.) Functions take
the session they run in; the callers own the transactions."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.base import table_of
from app.db.tokens import ApiToken, ApiTokenGrant

TOKENS = table_of(ApiToken)


async def add_token(session: AsyncSession, token: ApiToken) -> None:
    """The token row first: its grants refer to it."""
    session.add(token)
    await session.flush()


async def add_grant(session: AsyncSession, grant: ApiTokenGrant) -> None:
    """Inserted when the transaction commits, with its chain entry (app.audit.chain)."""
    session.add(grant)


async def set_revoked(session: AsyncSession, token_id: str, at: datetime) -> bool:
    """Set the token's ``revoked_at`` unless it is set already; whether this call set it (a
    concurrent revocation of the same token sets it once)."""
    result = await session.execute(
        update(TOKENS)
        .where(TOKENS.c.id == token_id, TOKENS.c.revoked_at.is_(None))
        .values(revoked_at=at)
    )
    return bool(getattr(result, "rowcount", 0))


async def token(session: AsyncSession, token_id: str) -> ApiToken | None:
    return await session.get(ApiToken, token_id, populate_existing=True)


async def tokens(session: AsyncSession, workspace: str | None) -> Sequence[ApiToken]:
    """Every token (of ``workspace`` when given), oldest first."""
    query = select(ApiToken).order_by(ApiToken.created_at, ApiToken.id)
    if workspace is not None:
        query = query.where(ApiToken.workspace == workspace)
    return (await session.scalars(query)).all()
