"""The read models the contexts share: what a decision looks like to a search and to the
vector index, below every context that uses them.

- ``repository``: a search's reads of the decision rows (``Brief``, plain column values, and
  its tags and reasons) and the whole rows with tags and reasons (``load_decisions``), read
  by the decisions context, the search and the outbox relay alike;
- ``entries``: the vector index entry of a decision (its text and filterable metadata) and
  the short form of a decision in a list of results;
- ``filters``: the search filters, in Chroma's terms and in pure Python.

Nothing here imports a context (app.decisions, app.search, app.intents, app.outbox, ...):
they import these, so none of them needs another for its read models and no two of them
import each other round a cycle (tests/unit/test_layering.py).
"""
