"""Test databases: which server the run uses (``CSTP_TEST_DATABASE_URL``), fresh copies of a
migrated template, and one statement as an auditor would run it."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

PG_URL = os.environ.get("CSTP_TEST_DATABASE_URL", "")


USE_PG = PG_URL.startswith("postgresql")


def pg_admin_dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


def with_db(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


@asynccontextmanager
async def _pg_database(prefix: str, template: str | None = None) -> AsyncIterator[str]:
    """A new Postgres database (from ``template`` when given) for the duration; its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    made_from = f' TEMPLATE "{template}"' if template else ""
    conn = await asyncpg.connect(pg_admin_dsn(PG_URL))
    try:
        await conn.execute(f'CREATE DATABASE "{name}"{made_from}')
    finally:
        await conn.close()
    try:
        yield with_db(PG_URL, name)
    finally:
        conn = await asyncpg.connect(pg_admin_dsn(PG_URL))
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


@asynccontextmanager
async def copy_database(template_db: str, folder: Path) -> AsyncIterator[str]:
    """A fresh database copied from the migrated template (dropped afterwards on Postgres)."""
    if USE_PG:
        async with _pg_database("cstp_t", template_db) as url:
            yield url
    else:
        path = folder / "cstp.db"
        shutil.copyfile(template_db, path)
        yield f"sqlite+aiosqlite:///{path}"


@asynccontextmanager
async def empty_database(folder: Path, prefix: str) -> AsyncIterator[str]:
    """A database with no tables at all: a new Postgres database named ``prefix`` and a random
    suffix (dropped afterwards), or a SQLite file to be under ``folder``/data."""
    if USE_PG:
        async with _pg_database(prefix) as url:
            yield url
    else:
        yield f"sqlite+aiosqlite:///{folder / 'data' / 'cstp.db'}"


async def run_sql(url: str, statement: str, **params: Any) -> list[dict[str, Any]]:
    """One statement on its own connection, as an auditor would run it."""
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            result = await conn.execute(text(statement), params)
            return [dict(row._mapping) for row in result] if result.returns_rows else []
    finally:
        await engine.dispose()
