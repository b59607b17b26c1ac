"""Whether a stored token is what its grants say (``cstp audit verify``'s ``token`` problems,
and the server's token lookup, app.access.lookup).

``api_tokens`` is the table the server looks tokens up in; it is not itself chained (its
``revoked_at`` is set when a token is revoked). Its grants (``api_token_grants``) are: each
creation and revocation is an append-only row covered by the audit chain, repeating what
the token lets in and its secret's SHA-256. A token row agrees with its grants when:

- exactly one grant records its creation, with the same workspace, agent, role, scopes,
  expiry and secret hash, made at ``created_at`` by ``created_by``;
- at most one grant records its revocation, repeating the same values; ``revoked_at`` is
  set exactly when it exists, to the time it records.

So a token widened by SQL (another role, more scopes, a later expiry, another workspace or
agent), given another secret hash, or brought back by clearing ``revoked_at`` disagrees with
its grants: verification reports it, and the lookup refuses it. What neither can catch alone:
a token row and a grant forged together by SQL agree with each other; the grant then has no
chain entry (reported ``inserted``; the lookup refuses a token whose creation's grant no
entry covers), or an entry appended by hand, which verification reports unless the chain has
no key (docs/AUDIT.md: a chain without ``CSTP_AUDIT_KEY`` can be recomputed by whoever
writes to the database; only a checkpoint kept elsewhere catches that).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection

from app.db.tokens import CREATE, REVOKE

from .problems import Problem
from .repository import grants as stored

GRANTED = ("workspace", "agent", "role", "scopes", "expires_at", "secret_sha256")
"""What a token lets in, as each of its grants repeats it."""


def disagreement(token: Mapping[str, Any], grants: Sequence[Mapping[str, Any]]) -> str | None:
    """Why ``token`` (an ``api_tokens`` row) is not what ``grants`` (its own) say; None when
    it is."""
    creates = [g for g in grants if g["action"] == CREATE]
    revokes = [g for g in grants if g["action"] == REVOKE]
    if len(creates) != 1:
        return (
            "no grant records its creation"
            if not creates
            else f"{len(creates)} grants record its creation"
        )
    if len(creates) + len(revokes) != len(grants):
        return "a grant of it records neither a creation nor a revocation"
    created = creates[0]
    differ = [c for c in GRANTED if token[c] != created[c]]
    if token["created_at"] != created["acted_at"]:
        differ.append("created_at")
    if token["created_by"] != created["acted_by"]:
        differ.append("created_by")
    if differ:
        return f"{', '.join(differ)} not what the grant of its creation records"
    if len(revokes) > 1:
        return f"{len(revokes)} grants record its revocation"
    if not revokes:
        if token["revoked_at"] is not None:
            return "revoked_at set, yet no grant records a revocation"
        return None
    revoked = revokes[0]
    if token["revoked_at"] is None:
        return "a grant records its revocation, yet revoked_at is empty"
    if token["revoked_at"] != revoked["acted_at"]:
        return "revoked_at is not the time the grant of its revocation records"
    differ = [c for c in GRANTED if token[c] != revoked[c]]
    if differ:
        return f"{', '.join(differ)} not what the grant of its revocation records"
    return None


def token_problems(conn: Connection) -> list[Problem]:
    """A ``token`` problem per token that disagrees with its grants (at the seq of its
    creation's grant when one is chained), and per grant whose token is not stored."""
    by_token: dict[str, list[Mapping[str, Any]]] = {}
    for grant in stored.grants(conn):
        by_token.setdefault(str(grant["token_id"]), []).append(grant)
    out: list[Problem] = []
    for token in stored.tokens(conn):
        token_id = str(token["id"])
        grants = by_token.pop(token_id, [])
        why = disagreement(token, grants)
        if why is not None:
            seqs = [g["seq"] for g in grants if g["action"] == CREATE and g["seq"] is not None]
            out.append(Problem("token", min(seqs, default=None), "api_tokens", token_id, why))
    for token_id, grants in by_token.items():
        for grant in grants:
            out.append(
                Problem(
                    "token",
                    grant["seq"],
                    "api_token_grants",
                    str(grant["id"]),
                    f"its token ({token_id[:40]!r}) is not in api_tokens",
                )
            )
    return out
