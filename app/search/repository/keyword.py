"""The statements of keyword search (app.search.keyword) over the database's full-text index
(``app/db/fulltext.py``): how many decisions each word's phrase matches, and the ranked,
filtered list. Each runs on the connection of the caller's read."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    CursorResult,
    Float,
    Select,
    TextClause,
    bindparam,
    column,
    func,
    literal_column,
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
#: FTS5 bm25() weight of each column (decision, context, reasons, tags); the fifth column,
#: the workspace's token, weighs nothing.
BM25_WEIGHTS = (1.0, 1.0, 1.0, 1.0)
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
    conn: Connection, shape: filter_sql.Shape, params: dict[str, Any]
) -> CursorResult[*tuple[Any, ...]]:
    """The rows of the ranked statement for the filters' ``shape``, best first: the search
    columns, then the score."""
    return conn.execute(_statement(conn.dialect.name, shape), params)


# ---------------------------------------------------------------- which words count


@functools.lru_cache(maxsize=MAX_TERMS)
def _sqlite_counts(words: int) -> TextClause:
    """One statement: the matches of each of ``words`` queries (``:w0``..., each a phrase
    in one workspace: ``fts5_query``), each counted only up to ``:cap`` by an index read that
    stops there, and the table's row count (its largest key: rows are deleted only with
    their decision)."""
    each = ", ".join(
        f"(SELECT count(*) FROM (SELECT 1 FROM {fulltext.TABLE} "
        f"WHERE {fulltext.TABLE} MATCH :w{n} LIMIT :cap))"
        for n in range(words)
    )
    return text(f"SELECT {each}, (SELECT coalesce(max(id), 0) FROM {fulltext.KEYS})")


@functools.cache
def _pg_counts() -> TextClause:
    """The same on Postgres, in one statement whatever the number of words: each word's
    phrase query (``phraseto_tsquery``: Postgres parses the word, never as query syntax)
    and the workspace's lexeme, looked up in the GIN index with the query as a run-time key,
    and the planner's row estimate of the table. A phrase of stop words only (numnode 0) is
    not looked up."""
    return text(
        f"SELECT w.n, (SELECT count(*) FROM (SELECT 1 FROM {fulltext.TABLE} s "
        f"WHERE s.document @@ (w.q && CAST(:workspace AS tsquery)) LIMIT :cap) AS capped) "
        f"FROM (SELECT n, phraseto_tsquery('{PG_CONFIG}', word) AS q "
        f"FROM unnest(CAST(:words AS text[])) WITH ORDINALITY AS u(word, n)) AS w "
        f"WHERE numnode(w.q) > 0 "
        f"UNION ALL SELECT 0, greatest(reltuples, 0)::bigint FROM pg_class "
        f"WHERE oid = '{fulltext.TABLE}'::regclass"
    )


def word_counts(
    conn: Connection, workspace: str, words: Sequence[str], sqlite: bool, cap: int
) -> tuple[list[int], int]:
    """How many decisions of ``workspace`` each word's phrase matches (up to ``cap``), and
    how many decisions there are (in the whole database: a count per workspace would cost a
    read of the workspace's rows on every search)."""
    if sqlite:
        params: dict[str, Any] = {
            f"w{n}": fts5_query(workspace, [word]) for n, word in enumerate(words)
        }
        *counts, rows = conn.execute(_sqlite_counts(len(words)), {**params, "cap": cap}).one()
        return [int(n) for n in counts], int(rows)
    params = {
        "words": list(words),
        "cap": cap,
        "workspace": fulltext.pg_workspace_query(workspace),
    }
    rows = conn.execute(_pg_counts(), params).all()
    found: dict[int, int] = {int(n): int(count) for n, count in rows}
    return [found.get(n, 0) for n in range(1, len(words) + 1)], found.get(0, 0)


# ---------------------------------------------------------------- the statements


@functools.lru_cache(maxsize=256)
def _statement(dialect: str, shape: filter_sql.Shape) -> Select[Any]:
    """The ranked, filtered statement for a dialect and filter shape, built once: building
    a statement costs more than running it."""
    if dialect == "sqlite":
        return _sqlite_statement(shape)
    return _pg_statement(shape)


def _sqlite_statement(shape: filter_sql.Shape) -> Select[Any]:
    """Ranked by BM25 (ties in index order). The full-text query keeps to the workspace
    itself (``fts5_query``): with no other filter, the best ``limit`` are taken from the
    index before their rows are read (whose workspace condition then changes nothing);
    filtered, every match's row is checked first."""
    fts = table(fulltext.TABLE, column("rowid"))
    keys = table(fulltext.KEYS, column("id"), column("decision_id"))
    index: ColumnElement[Any] = literal_column(fulltext.TABLE)
    weights: list[ColumnElement[Any]] = [
        literal_column(repr(float(w))) for w in (*BM25_WEIGHTS, 0.0)
    ]
    bm25 = func.bm25(index, *weights, type_=Float())
    match = index.op("MATCH")(bindparam("match"))
    if filter_sql.is_empty(shape):
        ranked = (
            select(fts.c.rowid, bm25.label("rank"))
            .where(match)
            .order_by(bm25, fts.c.rowid)
            .limit(bindparam("limit"))
            .subquery("ranked")
        )
        return (
            select(*SEARCH_COLUMNS, (-ranked.c.rank).label("score"))
            .select_from(
                ranked.join(keys, keys.c.id == ranked.c.rowid).join(
                    Decision, Decision.id == keys.c.decision_id
                )
            )
            .where(*filter_sql.conditions(shape))
            .order_by(ranked.c.rank, ranked.c.rowid)
        )
    return (
        select(*SEARCH_COLUMNS, (-bm25).label("score"))
        .select_from(
            fts.join(keys, keys.c.id == fts.c.rowid).join(
                Decision, Decision.id == keys.c.decision_id
            )
        )
        .where(match, *filter_sql.conditions(shape))
        .order_by(bm25, fts.c.rowid)
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
