"""Keyword search over the database's own full-text index (``app/db/fulltext.py``).

The query is built from the user's text, never parsed as full-text syntax: each
whitespace-separated word becomes one quoted phrase (an FTS5 string, a Postgres
``phraseto_tsquery``), so ``OPS-1432``, ``ERR_CONN_RESET``, ``billing/invoice_worker.py``
and ``3.1.18`` match as written, in order, and no quote, operator or column name in the text
can change the query. The phrases are OR-ed and ranked by relevance (SQLite: FTS5's BM25;
Postgres: the sum of the BM25 weights of the phrases a decision holds), so a
natural-language query finds decisions that share only some of its words, the ones that
share its rarest words first. The index stems English words on both databases
(``app/db/fulltext.py``), and so does the query: ``caching`` finds ``cache``.

Cost: ranking reads every decision that matches any phrase, so the phrases are taken rarest
first while the decisions they match add up to at most ``POSTINGS_BUDGET`` (each counted by
an index read that stops there). A word found in that many decisions (``the``, ``service``
in a large journal) says little about which decision is meant, and BM25 gives it almost no
weight anyway; dropping it bounds the work of every query, whatever its length.

Every filter is applied in the same SQL statement, with the semantics of
``app.search.filters`` (``matches``), so the ranking is of matching decisions only.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
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
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import Text

from app.db import fulltext
from app.db.decisions import Decision
from app.decisions.repository import SEARCH_COLUMNS, Brief

from . import filter_sql
from .filters import SearchFilters

#: At most this many distinct words of a query are looked up (the first ones).
MAX_TERMS = 32
#: The phrases kept match this many decisions at most, together (see the module docstring).
POSTINGS_BUDGET = 500
#: A phrase found in more decisions than this is left out (and counted only up to here).
WORD_CAP = 250
#: FTS5 bm25() weight of each column (decision, context, reasons, tags).
BM25_WEIGHTS = (1.0, 1.0, 1.0, 1.0)
#: The text search configuration of the index (what its triggers use).
PG_CONFIG = fulltext.PG_CONFIG


@dataclass(frozen=True, slots=True)
class KeywordHit:
    """A decision that matches, with its score: its relevance to the query divided by the
    weight of all the query's words that occur in the journal, so about the share of the
    query's (rarer) words it holds: 1 for all of them, near 0 for a few common ones. The
    relevance is BM25 on SQLite (which also counts repeats and favours short texts, so a
    score may pass 1) and the sum of the matched phrases' BM25 weights (inverse document
    frequency) on Postgres."""

    decision: Brief
    score: float


def terms(query: str) -> list[str]:
    """The distinct words of ``query`` (split at whitespace, case folded) that hold a letter
    or a digit, in order, at most MAX_TERMS."""
    seen: dict[str, None] = {}
    for word in query.split():
        if any(ch.isalnum() for ch in word):
            seen.setdefault(word.casefold(), None)
            if len(seen) == MAX_TERMS:
                break
    return list(seen)


def fts5_phrase(word: str) -> str:
    """``word`` as one FTS5 string (a phrase of its tokens): double quotes doubled."""
    return '"' + word.replace('"', '""') + '"'


def search(conn: Connection, query: str, filters: SearchFilters, limit: int) -> list[KeywordHit]:
    """The ``limit`` decisions satisfying ``filters`` that best match ``query``'s words,
    best first (ties: SQLite in index order, Postgres by id)."""
    words = terms(query)
    if not words or limit < 1:
        return []
    values = filter_sql.values(filters)
    statement = _statement(conn.dialect.name, filter_sql.shape(filters))
    if conn.dialect.name == "sqlite":
        kept, weight = _sqlite_kept(conn, words)
        if not kept:
            return []
        params: dict[str, Any] = {"match": " OR ".join(fts5_phrase(w) for w in kept)}
    else:
        params, weight = (
            {"words": words, "cap": WORD_CAP + 1, "budget": POSTINGS_BUDGET},
            1.0,
        )
    rows = conn.execute(statement, {**params, **values, "limit": limit})
    return [KeywordHit(Brief(*row[:-1]), float(row[-1]) / weight) for row in rows]


# ---------------------------------------------------------------- which words count


@functools.lru_cache(maxsize=MAX_TERMS)
def _sqlite_counts(words: int) -> TextClause:
    """One statement counting the matches of ``words`` phrases (``:w0``...), each only up
    to ``:cap`` (one statement: each costs more to send than to run)."""
    counts = ", ".join(
        f"(SELECT count(*) FROM (SELECT 1 FROM {fulltext.TABLE} "
        f"WHERE {fulltext.TABLE} MATCH :w{n} LIMIT :cap))"
        for n in range(words)
    )
    return text(f"SELECT {counts}")


_SQLITE_ROWS = text(f"SELECT coalesce(max(id), 0) FROM {fulltext.KEYS}")


def fts5_idf(rows: int, found: int) -> float:
    """FTS5's BM25 weight of a phrase found in ``found`` of ``rows`` rows."""
    return max(1e-6, math.log((rows - found + 0.5) / (found + 0.5)))


def _sqlite_kept(conn: Connection, words: Sequence[str]) -> tuple[list[str], float]:
    """The words to search by, rarest first, within the budget (see the module docstring),
    and the BM25 weight of every word found (the score's divisor). Each count reads the
    index only up to the budget; the row count is the largest key (rows are never deleted
    but with their decision)."""
    params: dict[str, Any] = {f"w{n}": fts5_phrase(word) for n, word in enumerate(words)}
    counts = conn.execute(_sqlite_counts(len(words)), {**params, "cap": WORD_CAP + 1}).one()
    counted = [(int(found), word) for found, word in zip(counts, words, strict=True) if found]
    if not counted:
        return [], 1.0
    rows = max(int(conn.execute(_SQLITE_ROWS).scalar_one()), max(n for n, _ in counted))
    kept: list[str] = []
    total = 0
    for found, word in sorted(counted):
        total += found
        if found > WORD_CAP or total > POSTINGS_BUDGET:
            break
        kept.append(word)
    return kept, sum(fts5_idf(rows, found) for found, _ in counted)


def _pg_scored() -> TextClause:
    """Postgres does what ``_sqlite_kept`` does in the statement itself (one round trip):
    each word's phrase query (from ``phraseto_tsquery``, never parsed from the user's text),
    its capped count and BM25 weight (inverse document frequency, from the count and the
    table's row estimate), a running total of counts rarest first; then, for each decision
    that the kept phrases match (found by the GIN index phrase by phrase, so the work is
    their matches and no more), the sum of their weights, divided by the weight of all the
    phrases found. (``ts_rank`` has no document frequency: a common word counts as much
    as a ticket id there, and the benchmark's exact-token queries lost a tenth of their
    recall with it.)"""
    return text(
        f"""
        WITH counted AS (
            SELECT words.q, (
                SELECT count(*) FROM (
                    SELECT 1 FROM {fulltext.TABLE} s WHERE s.document @@ words.q LIMIT :cap
                ) AS capped
            ) AS n
            FROM (
                SELECT DISTINCT phraseto_tsquery('{PG_CONFIG}', w) AS q
                FROM unnest(:words) AS w
            ) AS words
            WHERE numnode(words.q) > 0
        ), weighed AS (
            SELECT c.q, c.n,
                ln(1 + (greatest(t.total, c.n) - c.n + 0.5) / (c.n + 0.5)) AS idf,
                sum(c.n) OVER (ORDER BY c.n, c.q::text ROWS UNBOUNDED PRECEDING) AS running
            FROM counted c, (
                SELECT greatest(reltuples, 0) AS total FROM pg_class
                WHERE oid = '{fulltext.TABLE}'::regclass
            ) AS t
            WHERE c.n > 0
        )
        SELECT s.decision_id, sum(k.idf) / (SELECT sum(idf) FROM weighed) AS score
        FROM weighed k JOIN {fulltext.TABLE} s ON s.document @@ k.q
        WHERE k.running <= :budget AND k.n <= :cap - 1
        GROUP BY s.decision_id
        """
    ).bindparams(bindparam("words", type_=ARRAY(Text())))


# ---------------------------------------------------------------- the statements


@functools.lru_cache(maxsize=256)
def _statement(dialect: str, shape: tuple[Any, ...]) -> Select[Any] | TextClause:
    """The ranked, filtered statement for a dialect and filter shape (built once: building a
    statement costs more than running it)."""
    if dialect == "sqlite":
        return _sqlite_statement(shape)
    return _pg_statement(shape)


def _sqlite_statement(shape: filter_sql.Shape) -> Select[Any]:
    """Ranked by BM25 (ties in index order). Unfiltered, the best ``limit`` are taken from
    the index before their rows are read; filtered, every match's row is checked first."""
    fts = table(fulltext.TABLE, column("rowid"))
    keys = table(fulltext.KEYS, column("id"), column("decision_id"))
    index: ColumnElement[Any] = literal_column(fulltext.TABLE)
    weights: list[ColumnElement[Any]] = [literal_column(repr(float(w))) for w in BM25_WEIGHTS]
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


def _pg_statement(shape: tuple[Any, ...]) -> Select[Any]:
    scored = _pg_scored().columns(column("decision_id"), column("score")).subquery("scored")
    return (
        select(*SEARCH_COLUMNS, scored.c.score)
        .select_from(scored.join(Decision, Decision.id == scored.c.decision_id))
        .where(*filter_sql.conditions(shape))
        .order_by(scored.c.score.desc(), Decision.id)
        .limit(bindparam("limit"))
    )
