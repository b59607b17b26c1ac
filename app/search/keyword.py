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

Cost: ranking reads every decision that matches any phrase, so a first statement counts
each phrase's matches (by an index read that stops after ``WORD_CAP``), and the phrases
are taken rarest first, none found in more than ``WORD_CAP`` decisions and at most
``POSTINGS_BUDGET`` matches in all. A word found in that many decisions (``the``,
``service`` in a large journal) says little about which decision is meant, and BM25 gives
it little weight anyway; leaving it out bounds the work of every query, whatever its
length (on the benchmark, recall did not change between a cap of 250 and none). A score is
divided by the weight of every phrase found, the left-out ones included.

Every filter is applied in the same SQL statement, with the semantics of
``app.records.filters`` (``matches``), so the ranking is of matching decisions only.
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

from app.db import fulltext
from app.db.decisions import Decision
from app.records.filters import SearchFilters
from app.records.repository import SEARCH_COLUMNS, Brief

from . import filter_sql

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
    best first (ties: SQLite in index order, Postgres by id). Two statements: the words'
    counts, then the ranking."""
    words = terms(query)
    if not words or limit < 1:
        return []
    sqlite = conn.dialect.name == "sqlite"
    counts, decisions = _counts(conn, words, sqlite)
    found = [(n, word) for n, word in zip(counts, words, strict=True) if n]
    if not found:
        return []
    decisions = max(decisions, max(n for n, _ in found))
    kept: list[tuple[int, str]] = []
    total = 0
    for n, word in sorted(found):
        total += n
        if n > WORD_CAP or total > POSTINGS_BUDGET:
            break
        kept.append((n, word))
    if not kept:
        return []
    shape = filter_sql.shape(filters)
    params: dict[str, Any] = {**filter_sql.values(filters), "limit": limit}
    if sqlite:
        # BM25 over the kept phrases, divided by the weight of every phrase found
        weight = sum(fts5_idf(decisions, n) for n, _ in found)
        params["match"] = " OR ".join(fts5_phrase(word) for _, word in kept)
    else:
        # the kept phrases' weights, summed per decision, over the weight of all found
        weight = sum(bm25_idf(decisions, n) for n, _ in found)
        params["words"] = [word for _, word in kept]
        params["weights"] = [bm25_idf(decisions, n) for n, _ in kept]
    statement = _statement(conn.dialect.name, shape)
    return [
        KeywordHit(Brief(*row[:-1]), float(row[-1]) / weight)
        for row in conn.execute(statement, params)
    ]


# ---------------------------------------------------------------- which words count


@functools.lru_cache(maxsize=MAX_TERMS)
def _sqlite_counts(words: int) -> TextClause:
    """One statement: the matches of each of ``words`` phrases (``:w0``...), each counted
    only up to ``:cap`` by an index read that stops there, and the table's row count (its
    largest key: rows are deleted only with their decision)."""
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
    looked up in the GIN index with the phrase as a run-time key, and the planner's row
    estimate of the table. A phrase of stop words only (numnode 0) is not looked up."""
    return text(
        f"SELECT w.n, (SELECT count(*) FROM (SELECT 1 FROM {fulltext.TABLE} s "
        f"WHERE s.document @@ w.q LIMIT :cap) AS capped) "
        f"FROM (SELECT n, phraseto_tsquery('{PG_CONFIG}', word) AS q "
        f"FROM unnest(CAST(:words AS text[])) WITH ORDINALITY AS u(word, n)) AS w "
        f"WHERE numnode(w.q) > 0 "
        f"UNION ALL SELECT 0, greatest(reltuples, 0)::bigint FROM pg_class "
        f"WHERE oid = '{fulltext.TABLE}'::regclass"
    )


def _counts(conn: Connection, words: Sequence[str], sqlite: bool) -> tuple[list[int], int]:
    """How many decisions each word's phrase matches (up to WORD_CAP + 1), and how many
    decisions there are."""
    cap = WORD_CAP + 1
    if sqlite:
        params: dict[str, Any] = {f"w{n}": fts5_phrase(word) for n, word in enumerate(words)}
        *counts, rows = conn.execute(_sqlite_counts(len(words)), {**params, "cap": cap}).one()
        return [int(n) for n in counts], int(rows)
    rows = conn.execute(_pg_counts(), {"words": list(words), "cap": cap}).all()
    found: dict[int, int] = {int(n): int(count) for n, count in rows}
    return [found.get(n, 0) for n in range(1, len(words) + 1)], found.get(0, 0)


def fts5_idf(rows: int, found: int) -> float:
    """FTS5's BM25 weight of a phrase found in ``found`` of ``rows`` rows."""
    return max(1e-6, math.log((rows - found + 0.5) / (found + 0.5)))


def bm25_idf(rows: int, found: int) -> float:
    """BM25's weight of a phrase found in ``found`` of ``rows`` decisions, in the form that
    is never negative (Lucene's): Postgres has no BM25, so its ranking is the sum of these
    over the phrases a decision holds."""
    return math.log(1.0 + (rows - found + 0.5) / (found + 0.5))


# ---------------------------------------------------------------- the statements


@functools.lru_cache(maxsize=256)
def _statement(dialect: str, shape: filter_sql.Shape) -> Select[Any]:
    """The ranked, filtered statement for a dialect and filter shape, built once: building
    a statement costs more than running it."""
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


def _pg_statement(shape: filter_sql.Shape) -> Select[Any]:
    """Each kept phrase's matches, found in the GIN index with the phrase as a run-time
    key, weighted by ``:weights``; summed per decision, filtered, best first (ties by id)."""
    matched = (
        text(
            f"SELECT s.decision_id, k.weight FROM unnest(CAST(:words AS text[]), "
            f"CAST(:weights AS float8[])) AS k(word, weight) "
            f"JOIN {fulltext.TABLE} s ON s.document @@ phraseto_tsquery('{PG_CONFIG}', k.word)"
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
