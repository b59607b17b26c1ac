"""How hybrid retrieval merges the vector side's list with the keyword side's.

A decision's hybrid score is its cosine similarity to the query plus a keyword bonus::

    score = (1 - distance) + KEYWORD_WEIGHT / sqrt(words) * keyword_score ** 2

``keyword_score`` is app.search.keyword's (about the share of the query's weight the
decision's text holds: 1 when it holds every word), ``words`` the number of distinct words
of the query. Squared, a decision that holds most of the query's rare words gains much more
than one that shares a word or two with it. The bonus weighs more the shorter the query: a
query of one or two words (``OPS-1432``, ``redis timeout``) is a keyword query, and the
decision that holds them should come first even when its text means something else as a
whole; in a sentence each word is a small part of the meaning, which the embedding
captures better. A decision that only the
keyword side found has no distance from this search: it counts with the largest distance of
the vector side's list (a bound: it was not among the nearest), and a decision only the
vector side found has keyword score 0.

Each side contributes its best ``DEPTH`` decisions (more when the limit asks for more).

Chosen by the retrieval-quality benchmark (``python -m bench.quality_tune``,
docs/QUALITY.md) on its tuning half: it beat reciprocal rank fusion (k 5-60, keyword weight
0.5-2) and a fixed blend of the two scores, and it was at least as good as the better side
on every query kind, and as semantic search for announceIntent, on both databases.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: The keyword bonus of a one-word query (see the module docstring).
KEYWORD_WEIGHT = 2.0
#: Candidates taken from each side when the limit is at most DEPTH - 10.
DEPTH = 30


@dataclass(frozen=True, slots=True)
class Fused:
    id: str
    score: float
    distance: float | None  # the cosine distance, when the vector side found the decision
    keyword: float | None  # the keyword score, when the keyword side found it


def keyword_weight(words: int) -> float:
    """The weight of the keyword score for a query of ``words`` distinct words."""
    return KEYWORD_WEIGHT / math.sqrt(max(1, words))


def fuse(
    vector: Sequence[tuple[str, float]],
    keyword: Sequence[tuple[str, float]],
    words: int,
) -> list[Fused]:
    """``vector``: (id, cosine distance), nearest first; ``keyword``: (id, keyword score),
    best first; both already satisfy the filters. Every decision of either list, best
    hybrid score first (ties by id)."""
    distances = dict(vector)
    scores = dict(keyword)
    bound = max(distances.values(), default=1.0)
    weight = keyword_weight(words)
    fused = [
        Fused(
            id,
            (1.0 - distances.get(id, bound)) + weight * scores.get(id, 0.0) ** 2,
            distances.get(id),
            scores.get(id),
        )
        for id in dict.fromkeys([*distances, *scores])
    ]
    fused.sort(key=lambda f: (-f.score, f.id))
    return fused
