"""The SQL of the intents context: the reads and writes of the ``intents`` and
``intent_matches`` tables.

The one read here so far is an agent's successful announcement by its correlationId, which
both announceIntent (to replay an announcement) and recordDecision (to link the decision to
its intent) make. recordDecision reads it here, not through app.intents.service, so that the
decisions context does not depend on announceIntent and, through it, on the search.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Row, bindparam, insert, literal_column, select, union_all
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.approvals.repository import insert_approvals
from app.db.base import table_of
from app.db.intents import Intent, IntentMatch
from app.operations.context import CallContext


# Built once: building a statement costs more than running this one (indexed lookups).
# The agent's successful announcement of a correlation id, else its latest escalated one
# (answered, but waiting for an approval: re-announcements are evaluated again). One branch
# per outcome, so that each is a look-up in its own partial index.
def _announced(outcome: str, rank: int) -> Any:  # a Select of the columns below
    return select(
        Intent.id,
        Intent.correlation_id,
        Intent.request_hash,
        Intent.response,
        Intent.similar_found,
        Intent.allowed,
        Intent.outcome,
        literal_column(str(rank)).label("rank"),
        Intent.received_at,
    ).where(
        Intent.workspace == bindparam("workspace"),
        Intent.agent == bindparam("agent"),
        Intent.correlation_id == bindparam("cid"),
        # written out, not bound: a partial index serves only its own condition's text
        Intent.outcome == literal_column(f"'{outcome}'"),
    )


_BOTH = union_all(_announced("ok", 0), _announced("escalated", 1)).subquery()
_STORED = (
    select(
        _BOTH.c.id,
        _BOTH.c.correlation_id,
        _BOTH.c.request_hash,
        _BOTH.c.response,
        _BOTH.c.similar_found,
        _BOTH.c.allowed,
        _BOTH.c.outcome,
    )
    .order_by(_BOTH.c.rank, _BOTH.c.received_at.desc())
    .limit(1)
)


if TYPE_CHECKING:
    # A row of _STORED. Only an annotation: SQLAlchemy 2.0's Row takes one type argument.
    StoredIntent = Row[str, str, str | None, str | None, int | None, bool | None, str]


def _read_stored(
    conn: Connection, *, workspace: str, agent: str, correlation_id: str
) -> StoredIntent | None:
    params = {"workspace": workspace, "agent": agent, "cid": correlation_id}
    return conn.execute(_STORED, params).first()


async def stored(ctx: CallContext, correlation_id: str) -> StoredIntent | None:
    """This agent's successful announcement with ``correlation_id`` in the call's workspace,
    else its latest escalated one, if any (one indexed read): its ``id``, ``outcome``,
    ``request_hash``, ``response``, ``similar_found`` and ``allowed``.

    Read by ``Database.read``: on SQLite on a read connection, so it never takes the write
    lock; on Postgres in the call's transaction when it has one, else (announceIntent,
    recordDecision: they commit in batches) in a short one of its own, which ends before
    the call waits for its batch."""
    work = functools.partial(
        _read_stored, workspace=ctx.workspace, agent=ctx.agent, correlation_id=correlation_id
    )
    return await ctx.services.db.read(work, session=ctx.open_session)


# --- the writes: an announcement's rows, and the row of a refused one ---------------------

_INSERT_INTENTS = insert(table_of(Intent))
_INSERT_MATCHES = insert(table_of(IntentMatch))


async def insert_intents(session: AsyncSession, rows: Sequence[dict[str, Any]]) -> None:
    """Insert ``intents`` rows (one prepared INSERT, the rows as its parameters)."""
    await session.execute(_INSERT_INTENTS, rows)


async def insert_intent_unless_taken(
    session: AsyncSession, row: dict[str, Any], approval: dict[str, Any] | None = None
) -> bool:
    """Insert one ``intents`` row (and the ``approvals`` row its escalation asked for) under
    a savepoint: False, with nothing written, when its correlation id is already taken by
    this agent's successful announcement, or its approval by an escalated one."""
    try:
        async with session.begin_nested():
            if approval is not None:
                await insert_approvals(session, [approval])
            await session.execute(_INSERT_INTENTS, [row])
    except IntegrityError:
        return False
    return True


async def insert_matches(session: AsyncSession, rows: Sequence[dict[str, Any]]) -> None:
    """Insert ``intent_matches`` rows."""
    await session.execute(_INSERT_MATCHES, rows)


def add_refused(session: AsyncSession, intent: Intent) -> None:
    """Add the row of an announcement that ended in an error (written at commit)."""
    session.add(intent)
