"""The tamper-evident audit trail and replayable guardrail verdicts.

- ``audit_chain``: one hash-linked entry per audited row (intents, guardrail evaluations,
  decisions, decision reviews; app/audit), append-only; on Postgres the function
  ``cstp_audit_head()`` that appenders call to take the chain's lock and read its head.
- ``guardrail_rule_sets``: every rule set an evaluation used, once per content hash, with its
  content (append-only); ``guardrail_evaluations.rule_set_hash`` names it.
- ``guardrail_rule_results.mode``, ``would_block``, ``would_warn``: shadow rules.

The upgrade builds the chain over the rows already stored, in their order of creation (their
timestamps; at the same instant evaluations, then intents, decisions and reviews; then by
key), under ``CSTP_AUDIT_KEY`` / ``CSTP_AUDIT_KEY_FILE`` when one is set, as the server would
have. Evaluations stored before this revision have no rule set to replay with. The downgrade
drops the chain, the rule sets and the new columns.

Frozen: what the upgrade computes (the audited columns, the canonical form and its digest,
the entry hash, the audit key's settings) is written out below as it was at this revision,
not imported from app.audit or app.config, so that a later change there cannot change what
this upgrade writes. The canonical form's definition is app/audit/canonical.py's docstring
(format 1: no ``later`` columns exist yet at this revision).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

import hashlib
import hmac
import itertools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import sqlalchemy as sa
from alembic import op

from app.db import triggers
from app.db.base import UtcDateTime

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APPEND_ONLY = {
    # table: (primary key column, its other unique keys as a collision with NEW)
    "audit_chain": (
        "seq",
        "EXISTS (SELECT 1 FROM audit_chain WHERE table_name = NEW.table_name "
        "AND row_id = NEW.row_id)",
    ),
    "guardrail_rule_sets": ("hash", None),
}
BATCH = 500
GENESIS = "0" * 64
LOCK_KEY = 0x6373747061756474  # "cstpaudt": the advisory lock that serializes appends
HEAD_FUNCTION = "cstp_audit_head"
MIN_AUDIT_KEY_BYTES = 16

# ---- the audited tables as of this revision: (column, kind), the kind saying how a value is
# brought to its canonical form; children: (table, parent column, columns, natural key)

BOOL, FLOAT, INT, TIME, JSON, TEXT = "bool", "float", "int", "time", "json", "text"
_TYPES: dict[str, Callable[[], Any]] = {
    BOOL: sa.Boolean,
    FLOAT: sa.Float,
    INT: sa.Integer,
    TIME: UtcDateTime,
    JSON: sa.JSON,
    TEXT: sa.Text,
}
Columns = tuple[tuple[str, str], ...]
Child = tuple[str, str, Columns, tuple[str, ...]]


def _columns(spec: str) -> Columns:
    """``"id:text confidence:float"`` -> ((id, text), (confidence, float))."""
    return tuple((c.split(":")[0], c.split(":")[1]) for c in spec.split())


AUDITED: dict[str, tuple[str, str, Columns, tuple[Child, ...]]] = {
    # name: (key, creation time, columns, children); chained in this order at one instant
    "guardrail_evaluations": (
        "id",
        "evaluated_at",
        _columns(
            "id:text agent:text source:text evaluated_at:time description:text category:text "
            "stakes:text confidence:float project:text facts:json allowed:bool evaluated:int "
            "violations:int warnings:int rule_set_version:text rule_set_hash:text"
        ),
        (
            (
                "guardrail_rule_results",
                "evaluation_id",
                _columns(
                    "guardrail_id:text severity:text mode:text fired:bool would_block:bool "
                    "would_warn:bool message:text error:text"
                ),
                ("guardrail_id",),
            ),
        ),
    ),
    "intents": (
        "id",
        "received_at",
        _columns(
            "id:text correlation_id:text agent:text received_at:time outcome:text "
            "error_code:int intent:text context:text category:text stakes:text "
            "confidence:float metadata:json claimed_agent:json request_hash:text allowed:bool "
            "evaluation_id:text similar_found:int response:text"
        ),
        (
            (
                "intent_matches",
                "intent_id",
                _columns("decision_id:text rank:int distance:float outcome:text"),
                ("rank",),
            ),
        ),
    ),
    "decisions": (
        "id",
        "created_at",
        _columns(
            "id:text summary:text decision:text category:text confidence:float stakes:text "
            "created_at:time recorded_by:text context:text mental_state:text review_in:text "
            "review_by:time kpi_indicators:json pre_query_run:bool pre_similar_found:int "
            "pre_guardrails_checked:bool pre_guardrails_passed:bool project:text feature:text "
            "pr:int file:text line:int commit:text intent_id:text correlation_id:text "
            "guardrail_evaluation_id:text"
        ),
        (
            (
                "decision_reasons",
                "decision_id",
                _columns("position:int type:text text:text strength:float"),
                ("position",),
            ),
            (
                "decision_tags",
                "decision_id",
                _columns("tag:text position:int"),
                ("position", "tag"),
            ),
        ),
    ),
    "decision_reviews": (
        "id",
        "reviewed_at",
        _columns(
            "id:int decision_id:text outcome:text actual_result:text lessons:text notes:text "
            "affected_kpis:json reviewed_by:text reviewed_at:time"
        ),
        (),
    ),
}


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.create_table(
        "guardrail_rule_sets",
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("rules", sa.Integer(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("hash", name=op.f("pk_guardrail_rule_sets")),
    )
    op.add_column("guardrail_evaluations", sa.Column("rule_set_hash", sa.String(64), nullable=True))
    op.create_index(
        op.f("ix_guardrail_evaluations_rule_set_hash"),
        "guardrail_evaluations",
        ["rule_set_hash"],
    )
    op.add_column(
        "guardrail_rule_results",
        sa.Column("mode", sa.String(8), nullable=False, server_default="enforce"),
    )
    for column in ("would_block", "would_warn"):
        op.add_column(
            "guardrail_rule_results",
            sa.Column(column, sa.Boolean(), nullable=False, server_default=sa.false()),
        )
    op.create_table(
        "audit_chain",
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("table_name", sa.String(64), nullable=False),
        sa.Column("row_id", sa.String(64), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("keyed", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_audit_chain")),
    )
    op.create_index("uq_audit_chain_row", "audit_chain", ["table_name", "row_id"], unique=True)
    for table, (key, also_when) in APPEND_ONLY.items():
        for statement in [
            *triggers.install(dialect, table),
            *triggers.refuse_replace(dialect, table, also_when, key=key),
        ]:
            op.execute(statement)
    if dialect == "postgresql":
        op.execute(
            f"CREATE FUNCTION {HEAD_FUNCTION}() RETURNS TABLE (seq bigint, hash varchar) AS $$ "
            f"BEGIN PERFORM pg_advisory_xact_lock({LOCK_KEY}); "
            "RETURN QUERY SELECT c.seq, c.hash FROM audit_chain AS c "
            "ORDER BY c.seq DESC LIMIT 1; END $$ LANGUAGE plpgsql VOLATILE"
        )
    _chain_existing_rows(op.get_bind())


def _table(name: str, columns: Columns) -> sa.TableClause:
    return sa.table(name, *(sa.column(c, _TYPES[kind]()) for c, kind in columns))


CHAIN = sa.table(
    "audit_chain",
    *(
        sa.column(c)
        for c in ("seq", "table_name", "row_id", "digest", "prev_hash", "hash", "keyed")
    ),
)


def _audit_key() -> bytes | None:
    """``CSTP_AUDIT_KEY``'s text or the content of the file ``CSTP_AUDIT_KEY_FILE`` names,
    stripped, as UTF-8; None when neither is set."""
    text, file = os.environ.get("CSTP_AUDIT_KEY") or "", os.environ.get("CSTP_AUDIT_KEY_FILE") or ""
    if text and file:
        raise RuntimeError("set CSTP_AUDIT_KEY or CSTP_AUDIT_KEY_FILE, not both")
    source = "CSTP_AUDIT_KEY"
    if file:
        source = f"CSTP_AUDIT_KEY_FILE ({file})"
        try:
            text = Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "unreadable"
            raise RuntimeError(f"{source}: cannot read the audit key: {reason}") from None
    if not text and not file:
        return None
    key = text.strip().encode("utf-8")
    if len(key) < MIN_AUDIT_KEY_BYTES:
        raise RuntimeError(
            f"{source}: the audit key must be at least {MIN_AUDIT_KEY_BYTES} bytes "
            "(e.g. `openssl rand -hex 32`)"
        )
    return key


# ---- the canonical form (app/audit/canonical.py's docstring, format 1) --------------------


def _iso_utc(value: datetime) -> str:
    v = value.astimezone(UTC) if value.tzinfo is not None else value
    return (
        f"{v.year:04d}-{v.month:02d}-{v.day:02d}T{v.hour:02d}:{v.minute:02d}:"
        f"{v.second:02d}.{v.microsecond:06d}Z"
    )


def _float(value: float) -> msgspec.Raw | str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return msgspec.Raw(float.__repr__(value + 0.0).encode())


def _key(key: Any) -> str:
    return str.__str__(key) if isinstance(key, str) else str(key)


def _json_value(value: Any) -> Any:
    if isinstance(value, bool) or value is None or type(value) in (int, str):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, Mapping):
        return {_key(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return str(value)


_CONVERT: dict[str, Callable[[Any], Any]] = {
    BOOL: bool,
    FLOAT: lambda v: _float(float(v)),
    INT: int,
    TIME: _iso_utc,
    JSON: _json_value,
    TEXT: str,
}
_ENCODER = msgspec.json.Encoder(order="sorted")


def _row(columns: Columns, values: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c, kind in columns:
        v = values.get(c)
        out[c] = None if v is None else _CONVERT[kind](v)
    return out


def _sort_rows(order: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    """By the natural key (None first, then by value), then by the whole encoding."""

    def natural(row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple([(row[c] is not None, row[c]) for c in order])

    keyed = sorted([(natural(row), n) for n, row in enumerate(rows)], key=lambda kn: kn[0])
    if any(a[0] == b[0] for a, b in itertools.pairwise(keyed)):
        rows.sort(key=lambda row: (*natural(row), _ENCODER.encode(row)))
    else:
        rows[:] = [rows[n] for _, n in keyed]


def _digests(conn: sa.Connection, name: str, keys: list[Any]) -> dict[str, str]:
    """The digests of the canonical forms of the rows of ``name`` with these keys (key as
    text -> digest), their values read through the column types."""
    key, _, columns, children = AUDITED[name]
    table = _table(name, columns)
    rows = {
        str(r[key]): dict(r)
        for r in conn.execute(sa.select(table).where(table.c[key].in_(keys))).mappings()
    }
    kids: dict[str, dict[str, list[dict[str, Any]]]] = {r: {} for r in rows}
    for child, parent, child_columns, _ in children:
        child_table = _table(child, ((parent, TEXT), *child_columns))
        wanted = sa.select(child_table).where(child_table.c[parent].in_(keys))
        for r in conn.execute(wanted).mappings():
            kids[str(r[parent])].setdefault(child, []).append(dict(r))
    found = {}
    for row_id, values in rows.items():
        form = _row(columns, values)
        for child, _, child_columns, order in children:
            listed = [_row(child_columns, r) for r in kids[row_id].get(child, ())]
            _sort_rows(order, listed)
            form[child] = listed
        found[row_id] = hashlib.sha256(_ENCODER.encode(form)).hexdigest()
    return found


def _link(
    start: tuple[int, str], entries: Sequence[tuple[str, str, str]], secret: bytes | None
) -> list[dict[str, Any]]:
    """The chain rows of ``entries`` (table, row id, digest) after the entry ``start``."""
    seq, prev = start
    rows = []
    for table, row_id, digest in entries:
        seq += 1
        message = _ENCODER.encode(
            {"seq": seq, "table": table, "row_id": row_id, "digest": digest, "prev": prev}
        )
        if secret is None:
            hashed = hashlib.sha256(message).hexdigest()
        else:
            hashed = hmac.new(secret, message, hashlib.sha256).hexdigest()
        rows.append(
            {
                "seq": seq,
                "table_name": table,
                "row_id": row_id,
                "digest": digest,
                "prev_hash": prev,
                "hash": hashed,
                "keyed": secret is not None,
            }
        )
        prev = hashed
    return rows


def _chain_existing_rows(conn: sa.Connection) -> None:
    """Every stored audited row, oldest first, in batches: digests, links, one INSERT each."""
    secret = _audit_key()
    order = {name: rank for rank, name in enumerate(AUDITED)}
    keys: list[tuple[Any, int, Any, str]] = []
    for name, (key, time, columns, _) in AUDITED.items():
        table = _table(name, columns)
        for row_key, when in conn.execute(sa.select(table.c[key], table.c[time])):
            keys.append((when, order[name], row_key, name))
    keys.sort()
    head = (0, GENESIS)
    for start in range(0, len(keys), BATCH):
        chunk = keys[start : start + BATCH]
        found: dict[tuple[str, str], str] = {}
        for name in AUDITED:
            ids = [k[2] for k in chunk if k[3] == name]
            if ids:
                digests = _digests(conn, name, ids)
                found.update(((name, row_id), d) for row_id, d in digests.items())
        entries = [
            (name, str(row_key), found[(name, str(row_key))]) for _, _, row_key, name in chunk
        ]
        rows = _link(head, entries, secret)
        conn.execute(sa.insert(CHAIN).values(rows))
        head = (rows[-1]["seq"], rows[-1]["hash"])


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute(f"DROP FUNCTION IF EXISTS {HEAD_FUNCTION}()")
    for table in APPEND_ONLY:
        for statement in [
            *triggers.remove(dialect, table),
            *triggers.remove_refuse_replace(dialect, table),
        ]:
            op.execute(statement)
    op.drop_index("uq_audit_chain_row", table_name="audit_chain")
    op.drop_table("audit_chain")
    for column in ("would_warn", "would_block", "mode"):
        op.drop_column("guardrail_rule_results", column)
    op.drop_index(
        op.f("ix_guardrail_evaluations_rule_set_hash"), table_name="guardrail_evaluations"
    )
    op.drop_column("guardrail_evaluations", "rule_set_hash")
    op.drop_table("guardrail_rule_sets")
