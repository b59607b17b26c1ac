"""Tokens kept in the database (SPEC.md, section 7; docs/OPERATIONS.md, "Tokens").

- ``rules``: what a token request must be (workspace, agent, role, scopes, lifetime), and the
  secret's and the public id's form.
- ``service``: creating, listing and revoking tokens (``cstp tokens``), each creation and
  revocation written with its audit row (a grant, chained) in one transaction.
- ``lookup``: the server's look-up of a presented secret, with its short per-process cache.
- ``repository``: their SQL.
"""
