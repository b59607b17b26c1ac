"""Keyword search over the database's own full-text index (``app/db/fulltext.py``).

The query is built from the user's text, never parsed as full-text syntax: each
whitespace-separated word becomes one quoted phrase (an FTS5 string, a Postgres
``phraseto_tsquery``), so ``OPS-1432``, ``ERR_CONN_RESET``, ``billing/invoice_worker.py``
and ``3.1.18`` match as written, in order, and no quote, operator or column name in the text
can change the query. The phrases are OR-ed and ranked by relevance: the sum of the BM25
weights (inverse document frequency) of the phrases a decision holds, on both databases, so a
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
``app.records.filters`` (``matches``), so the ranking is of matching decisions only. The
caller's workspace is also part of the full-text query itself (revision 0014's token or
lexeme): the words are counted, kept, weighed (against the workspace's own number of
decisions, revision 0015) and matched among that workspace's decisions only.

The statements are app.search.repository.keyword's; this module chooses the phrases and
scores what they return.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from app.records.filters import SearchFilters
from app.records.repository import Brief

from .repository import filter_sql
from .repository import keyword as statements
from .repository.keyword import MAX_TERMS as MAX_TERMS
from .repository.keyword import fts5_phrase as fts5_phrase

#: The phrases kept match this many decisions at most, together (see the module docstring).
POSTINGS_BUDGET = 500
#: A phrase found in more decisions than this is left out (and counted only up to here).
WORD_CAP = 250


@dataclass(frozen=True, slots=True)
class KeywordHit:
    """A decision that matches, with its score: its relevance to the query (the sum of the
    matched phrases' BM25 weights, inverse document frequency in the caller's workspace)
    divided by the weight of all the query's words that occur in the workspace, so about the
    share of the query's (rarer) words it holds: 1 for all of them, near 0 for a few common
    ones. Nothing of another workspace enters it."""

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


def search(conn: Connection, query: str, filters: SearchFilters, limit: int) -> list[KeywordHit]:
    """The ``limit`` decisions satisfying ``filters`` that best match ``query``'s words,
    best first (ties: SQLite in index order, Postgres by id). Two statements: the words'
    counts, then the ranking."""
    words = terms(query)
    if not words or limit < 1:
        return []
    sqlite = conn.dialect.name == "sqlite"
    workspace = filters.workspace
    counts, decisions = statements.word_counts(conn, workspace, words, sqlite, WORD_CAP + 1)
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
    # the kept phrases' weights, summed per decision, over the weight of every phrase found
    weight = sum(bm25_idf(decisions, n) for n, _ in found)
    params: dict[str, Any] = {**filter_sql.values(filters), "limit": limit}
    if sqlite:
        for n, (count, word) in enumerate(kept):
            params[f"q{n}"] = statements.fts5_query(workspace, [word])
            params[f"k{n}"] = bm25_idf(decisions, count)
    else:
        params["words"] = [word for _, word in kept]
        params["workspace"] = statements.pg_workspace(workspace)
        params["weights"] = [bm25_idf(decisions, n) for n, _ in kept]
    return [
        KeywordHit(Brief(*row[:-1]), float(row[-1]) / weight)
        for row in statements.ranked(conn, shape, params, len(kept))
    ]


def bm25_idf(rows: int, found: int) -> float:
    """BM25's weight of a phrase found in ``found`` of ``rows`` decisions, in the form that
    is never negative (Lucene's): Postgres has no BM25, so its ranking is the sum of these
    over the phrases a decision holds."""
    return math.log(1.0 + (rows - found + 0.5) / (found + 0.5))
