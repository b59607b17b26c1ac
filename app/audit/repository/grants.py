"""The reads of the token check (app.audit.grants): stored tokens and their grants, each grant
with the sequence number of the chain entry that covers it (None when none does).

Values come as the database holds them, without the column types' conversions (as
verification reads audited rows, app.audit.stored): a value changed by hand into something
the server never writes is then reported, not a failure of the whole read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import JSON, Connection, Table, Text, and_, cast, select, type_coerce
from sqlalchemy.types import NullType

from app.db.base import table_of
from app.db.tokens import ApiToken, ApiTokenGrant

from .entries import CHAIN

TOKENS = table_of(ApiToken)
GRANTS = table_of(ApiTokenGrant)


def _as_stored(table: Table) -> list[Any]:
    """Every column of ``table`` as stored: JSON as its text (asyncpg would hand it over
    parsed), anything else without its type's conversion."""
    return [
        (cast(c, Text) if isinstance(c.type, JSON) else type_coerce(c, NullType())).label(c.name)
        for c in table.columns
    ]


def _covering() -> Any:
    return and_(CHAIN.c.table_name == GRANTS.name, CHAIN.c.row_id == GRANTS.c.id)


def _grants() -> Any:
    return select(*_as_stored(GRANTS), CHAIN.c.seq).select_from(
        GRANTS.outerjoin(CHAIN, _covering())
    )


def tokens(conn: Connection) -> Sequence[Any]:
    """Every ``api_tokens`` row, oldest first."""
    query = select(*_as_stored(TOKENS)).order_by(TOKENS.c.created_at, TOKENS.c.id)
    return conn.execute(query).mappings().all()


def grants(conn: Connection) -> Sequence[Any]:
    """Every ``api_token_grants`` row with its ``seq``, oldest first."""
    return conn.execute(_grants().order_by(GRANTS.c.acted_at, GRANTS.c.id)).mappings().all()


def token_by_digest(conn: Connection, digest_hex: str) -> tuple[Any | None, Sequence[Any]]:
    """The token whose secret has this SHA-256 (None when none has) and its grants."""
    token = (
        conn.execute(select(*_as_stored(TOKENS)).where(TOKENS.c.secret_sha256 == digest_hex))
        .mappings()
        .first()
    )
    if token is None:
        return None, ()
    found = conn.execute(_grants().where(GRANTS.c.token_id == token["id"])).mappings().all()
    return token, found
