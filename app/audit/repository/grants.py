"""The reads of the token check (app.audit.grants): every stored token and every grant, each
grant with the sequence number of the chain entry that covers it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, and_, select

from app.db.base import table_of
from app.db.tokens import ApiToken, ApiTokenGrant

from .entries import CHAIN

TOKENS = table_of(ApiToken)
GRANTS = table_of(ApiTokenGrant)


def tokens(conn: Connection) -> Sequence[Any]:
    """Every ``api_tokens`` row, oldest first (values read through the column types)."""
    return conn.execute(select(TOKENS).order_by(TOKENS.c.created_at, TOKENS.c.id)).mappings().all()


def grants(conn: Connection) -> Sequence[Any]:
    """Every ``api_token_grants`` row with ``seq``, its chain entry's (None when none covers
    it), oldest first."""
    covering = and_(CHAIN.c.table_name == GRANTS.name, CHAIN.c.row_id == GRANTS.c.id)
    return (
        conn.execute(
            select(GRANTS, CHAIN.c.seq)
            .select_from(GRANTS.outerjoin(CHAIN, covering))
            .order_by(GRANTS.c.acted_at, GRANTS.c.id)
        )
        .mappings()
        .all()
    )
