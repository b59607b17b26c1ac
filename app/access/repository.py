"""The SQL of the tokens: inserting a token and its grants, revoking, listing, and the
server's look-up by the SHA-256 of a secret. Functions take the session or connection they
run in; the callers own the transactions."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, exists, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.audit import AuditEntry
from app.db.base import table_of
from app.db.tokens import ApiToken, ApiTokenGrant

TOKENS = table_of(ApiToken)
GRANTS = table_of(ApiTokenGrant)
CHAIN = table_of(AuditEntry)


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


def by_digest(
    conn: Connection, digest_hex: str
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The token whose secret has this SHA-256 (None when none has), and its grants, each
    with ``chained``: whether an audit chain entry covers it."""
    found = conn.execute(select(TOKENS).where(TOKENS.c.secret_sha256 == digest_hex)).first()
    if found is None:
        return None, []
    token = dict(found._mapping)
    chained = exists().where(and_(CHAIN.c.table_name == GRANTS.name, CHAIN.c.row_id == GRANTS.c.id))
    grants = conn.execute(
        select(GRANTS, chained.label("chained")).where(GRANTS.c.token_id == token["id"])
    )
    return token, [dict(g._mapping) for g in grants]
