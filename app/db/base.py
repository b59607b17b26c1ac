"""Declarative base with a constraint naming convention shared by SQLite and Postgres.

The convention gives every constraint a deterministic name, so Alembic migrations (and
SQLite batch-mode table rebuilds) refer to the same names on both databases.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime, Dialect, MetaData, String, Table
from sqlalchemy.orm import DeclarativeBase, MappedColumn, mapped_column
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


DEFAULT_WORKSPACE = "default"


def workspace_column() -> MappedColumn[str]:
    """The ``workspace`` every row belongs to (SPEC.md, section 7). The rows stored before
    workspaces existed are in ``default`` (revision 0012); every writer names the workspace
    of its rows itself."""
    return mapped_column(String(63), server_default=DEFAULT_WORKSPACE)


def table_of(model: type[Base]) -> Table:
    """The Table ``model`` is mapped to, for Core statements (SQLAlchemy types ``__table__``
    as any FromClause; ours are all plain tables)."""
    table = model.__table__
    assert isinstance(table, Table)
    return table


class UtcDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on both databases.

    Postgres stores ``timestamptz``; SQLite has no time zones, so values are stored as naive
    UTC and given back their UTC zone when read.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise TypeError("UtcDateTime needs a datetime")
        if value.tzinfo is None:
            raise ValueError("naive datetimes are refused: pass an aware UTC datetime")
        utc = value.astimezone(UTC)
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        stored: datetime = value  # what the DateTime column reads back
        if stored.tzinfo is None:
            return stored.replace(tzinfo=UTC)
        return stored.astimezone(UTC)
