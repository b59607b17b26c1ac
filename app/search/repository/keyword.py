"""The statements of keyword search (app.search.keyword) over the database's full-text index
(``app/db/fulltext.py``): how many decisions each word's phrase matches, and the ranked,
filtered list. Each runs on the connection of the caller's read."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    CursorResult,
    Select,
    TextClause,
    bindparam,
    column,
    func,
    select,
    table,
    text,
)

from app.db import fulltext
from app.db.decisions import Decision
from app.records.repository import SEARCH_COLUMNS

from . import filter_sql

#: At most this many distinct words of a query are looked up (the first ones).
MAX_TERMS = 32
#: The text columns: a query's words are looked up in these only (never in the workspace's).
TEXT_COLUMNS = "{" + " ".join(fulltext.COLUMNS) + "}"
#: The text search configuration of the index (what its triggers use).
PG_CONFIG = fulltext.PG_CONFIG


def fts5_phrase(word: str) -> str:
    """``word`` as one FTS5 string (a phrase of its tokens): double quotes doubled."""
    return '"' + word.replace('"', '""') + '"'


def pg_workspace(workspace: str) -> str:
    """The ``:workspace`` parameter of the Postgres statements: the workspace's lexeme as a
    ``tsquery``."""
    return fulltext.pg_workspace_query(workspace)


def fts5_query(workspace: str, words: Sequence[str]) -> str:
    """The FTS5 query of decisions of ``workspace`` holding any of ``words`` (each a phrase
    looked up in the text columns)."""
    token = fulltext.sqlite_workspace_token(workspace)
    phrases = " OR ".join(fts5_phrase(word) for word in words)
    return f'{fulltext.WORKSPACE_COLUMN} : "{token}" AND {TEXT_COLUMNS} : ({phrases})'


def ranked(
    conn: Connection, shape: filter_sql.Shape, params: dict[str, Any], phrases: int
) -> CursorResult[*tuple[Any, ...]]:
    """The rows of the ranked statement for the filters' ``shape`` and ``phrases`` kept
    phrases, best first: the search columns, then the score."""
    return conn.execute(_statement(conn.dialect.name, shape, phrases), params)


# ---------------------------------------------------------------- which words count


# How many decisions the workspace holds (revision 0015's count, kept by a trigger).
_WORKSPACE_SIZE = (
    "coalesce((SELECT decisions FROM workspace_decisions WHERE workspace = :workspace_id), 0)"
)


@functools.lru_cache(maxsize=MAX_TERMS)
def _sqlite_counts(words: int) -> TextClause:
    """One statement: the matches of each of ``words`` queries (``:w0``..., each a phrase
    in one workspace: ``fts5_query``), each counted only up to ``:cap`` by an index read that
    stops there, and the workspace's decisions (``workspace_decisions``)."""
    each = ", ".join(
        f"(SELECT count(*) FROM (SELECT 1 FROM {fulltext.TABLE} "
        f"WHERE {fulltext.TABLE} MATCH :w{n} LIMIT :cap))"
        for n in range(words)
    )
    return text(f"SELECT {each}, {_WORKSPACE_SIZE}")


@functools.cache
def _pg_counts() -> TextClause:
    """The same on Postgres, in one statement whatever the number of words: each word's
    phrase query (``phraseto_tsquery``: Postgres parses the word, never as query syntax)
    and the workspace's lexeme, looked up in the GIN index with the query as a run-time key,
    and the workspace's decisions. A phrase of stop words only (numnode 0) is not looked
    up."""
    return text(
        f"SELECT w.n, (SELECT count(*) FROM (SELECT 1 FROM {fulltext.TABLE} s "
        f"WHERE s.document @@ (w.q && CAST(:workspace AS tsquery)) LIMIT :cap) AS capped) "
        f"FROM (SELECT n, phraseto_tsquery('{PG_CONFIG}', word) AS q "
        f"FROM unnest(CAST(:words AS text[])) WITH ORDINALITY AS u(word, n)) AS w "
        f"WHERE numnode(w.q) > 0 "
        f"UNION ALL SELECT 0, {_WORKSPACE_SIZE}"
    )


def word_counts(
    conn: Connection, workspace: str, words: Sequence[str], sqlite: bool, cap: int
) -> tuple[list[int], int]:
    """How many decisions of ``workspace`` each word's phrase matches (up to ``cap``), and
    how many decisions the workspace holds."""
    if sqlite:
        params: dict[str, Any] = {
            f"w{n}": fts5_query(workspace, [word]) for n, word in enumerate(words)
        }
        params["workspace_id"] = workspace
        *counts, rows = conn.execute(_sqlite_counts(len(words)), {**params, "cap": cap}).one()
        return [int(n) for n in counts], int(rows)
    params = {
        "words": list(words),
        "cap": cap,
        "workspace": fulltext.pg_workspace_query(workspace),
        "workspace_id": workspace,
    }
    rows = conn.execute(_pg_counts(), params).all()
    found: dict[int, int] = {int(n): int(count) for n, count in rows}
    return [found.get(n, 0) for n in range(1, len(words) + 1)], found.get(0, 0)


# ---------------------------------------------------------------- the statements


@functools.lru_cache(maxsize=256)
def _statement(dialect: str, shape: filter_sql.Shape, phrases: int) -> Select[Any]:
    """The ranked, filtered statement for a dialect, filter shape and (SQLite) number of
    phrases, built once: building a statement costs more than running it."""
    if dialect == "sqlite":
        return _sqlite_statement(shape, phrases)
    return _pg_statement(shape)


def _sqlite_statement(shape: filter_sql.Shape, phrases: int) -> Select[Any]:
    """Each kept phrase's matches in the workspace (``:q0``…, each an ``fts5_query`` of one
    phrase), weighted by ``:k0``…; summed per decision, filtered, best first (ties by id):
    the ranking of ``_pg_statement``. Not FTS5's ``bm25()``, whose weights count every
    workspace's decisions."""
    union = " UNION ALL ".join(
        f"SELECT rowid AS rid, :k{n} AS weight FROM {fulltext.TABLE} "
        f"WHERE {fulltext.TABLE} MATCH :q{n}"
        for n in range(phrases)
    )
    matched = text(union).columns(column("rid"), column("weight")).subquery("matched")
    scored = (
        select(matched.c.rid, func.sum(matched.c.weight).label("score"))
        .group_by(matched.c.rid)
        .subquery("scored")
    )
    keys = table(fulltext.KEYS, column("id"), column("decision_id"))
    return (
        select(*SEARCH_COLUMNS, scored.c.score)
        .select_from(
            scored.join(keys, keys.c.id == scored.c.rid).join(
                Decision, Decision.id == keys.c.decision_id
            )
        )
        .where(*filter_sql.conditions(shape))
        .order_by(scored.c.score.desc(), Decision.id)
        .limit(bindparam("limit"))
    )


def _pg_statement(shape: filter_sql.Shape) -> Select[Any]:
    """Each kept phrase's matches in the workspace, found in the GIN index with the phrase
    and the workspace's lexeme as a run-time key, weighted by ``:weights``; summed per
    decision, filtered, best first (ties by id)."""
    matched = (
        text(
            f"SELECT s.decision_id, k.weight FROM unnest(CAST(:words AS text[]), "
            f"CAST(:weights AS float8[])) AS k(word, weight) "
            f"JOIN {fulltext.TABLE} s ON s.document @@ "
            f"(phraseto_tsquery('{PG_CONFIG}', k.word) && CAST(:workspace AS tsquery))"
        )
        .columns(column("decision_id"), column("weight"))
        .subquery("matched")
    )
    scored = (
        select(matched.c.decision_id, func.sum(matched.c.weight).label("score"))
        .group_by(matched.c.decision_id)
        .subquery("scored")
    )
    return (
        select(*SEARCH_COLUMNS, scored.c.score)
        .select_from(scored.join(Decision, Decision.id == scored.c.decision_id))
        .where(*filter_sql.conditions(shape))
        .order_by(scored.c.score.desc(), Decision.id)
        .limit(bindparam("limit"))
    )
