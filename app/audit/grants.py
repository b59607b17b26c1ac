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

Rows are read as stored and checked as verification checks audited rows (app.audit.stored):
a value changed by hand into a form the server never writes (a timestamp that is not one, a
``scopes`` that is not JSON) is reported, and refused by the lookup, never a failed read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from app.db.tokens import CREATE, REVOKE

from .problems import Problem
from .repository import grants as rows
from .stored import NotStored, row

GRANTED = ("workspace", "agent", "role", "scopes", "expires_at", "secret_sha256")
"""What a token lets in, as each of its grants repeats it."""
TOKEN_COLUMNS = tuple(c.name for c in rows.TOKENS.columns)
GRANT_COLUMNS = tuple(c.name for c in rows.GRANTS.columns)


def _token(raw: Mapping[str, Any]) -> dict[str, Any]:
    return row(raw, rows.TOKENS, TOKEN_COLUMNS)


def _grant(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A grant's values, with ``seq``: its chain entry's (None when none covers it)."""
    read = row(raw, rows.GRANTS, GRANT_COLUMNS)
    read["seq"] = None if raw["seq"] is None else int(raw["seq"])
    return read


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


@dataclass(frozen=True)
class StoredToken:
    """A token as stored, for the server's lookup: its values, and why it must be refused
    whatever they say (None: nothing against it)."""

    id: str
    values: dict[str, Any] | None  # None when a value cannot be read
    refusal: str | None


def stored_token(conn: Connection, digest_hex: str) -> StoredToken | None:
    """The token whose secret has this SHA-256, checked against its grants (and the grant of
    its creation against the chain: an entry must cover it); None when no token has it."""
    raw, raw_grants = rows.token_by_digest(conn, digest_hex)
    if raw is None:
        return None
    token_id = str(raw["id"])
    try:
        token = _token(raw)
        grants = [_grant(g) for g in raw_grants]
    except NotStored as exc:
        return StoredToken(token_id, None, f"a value is not in the form the server stores ({exc})")
    why = disagreement(token, grants)
    if why is None and not any(g["seq"] is not None for g in grants if g["action"] == CREATE):
        why = "no audit chain entry covers the grant of its creation"
    return StoredToken(token_id, token, why)


def token_problems(conn: Connection) -> list[Problem]:
    """A ``token`` problem per token that disagrees with its grants or cannot be read (at the
    seq of its creation's grant when one is chained), and per grant whose token is gone."""
    by_token: dict[str, list[dict[str, Any]]] = {}
    unreadable: set[str] = set()  # tokens with a grant that cannot be read
    for raw in rows.grants(conn):
        try:
            grant = _grant(raw)
        except NotStored:  # reported as a changed row by its chain entry
            unreadable.add(str(raw["token_id"]))
            continue
        by_token.setdefault(str(grant["token_id"]), []).append(grant)
    out: list[Problem] = []
    for raw in rows.tokens(conn):
        token_id = str(raw["id"])
        grants = by_token.pop(token_id, [])
        try:
            why = disagreement(_token(raw), grants)
        except NotStored as exc:
            why = f"a value is not in the form the server stores ({exc})"
        if token_id in unreadable:
            why = "a grant of it holds a value not in the form the server stores"
            unreadable.discard(token_id)
        if why is not None:
            seqs = [g["seq"] for g in grants if g["action"] == CREATE and g["seq"] is not None]
            out.append(Problem("token", min(seqs, default=None), "api_tokens", token_id, why))
    for token_id, grants in by_token.items():
        for grant in grants:
            out.append(_orphan(grant["seq"], str(grant["id"]), token_id))
    return out


def _orphan(seq: int | None, grant_id: str, token_id: str) -> Problem:
    return Problem(
        "token",
        seq,
        "api_token_grants",
        grant_id,
        f"its token ({token_id[:40]!r}) is not in api_tokens",
    )
