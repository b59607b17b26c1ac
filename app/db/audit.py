"""The audit chain: one hash-linked entry per audited row (app/audit, docs/AUDIT.md).

Append-only like the rows it covers. ``seq`` is gapless and given by the appender, which holds
the chain's lock (a Postgres advisory lock, SQLite's write lock) from reading the head to its
commit; ``(table_name, row_id)`` is unique: a row is covered once.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, workspace_column


class AuditEntry(Base):
    __tablename__ = "audit_chain"
    __table_args__ = (Index("uq_audit_chain_row", "table_name", "row_id", unique=True),)

    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    workspace: Mapped[str] = workspace_column()
    table_name: Mapped[str] = mapped_column(String(64))  # the covered row's table
    row_id: Mapped[str] = mapped_column(String(64))  # its primary key, as text
    digest: Mapped[str] = mapped_column(String(64))  # SHA-256 of the row's canonical form
    prev_hash: Mapped[str] = mapped_column(String(64))  # the previous entry's hash
    hash: Mapped[str] = mapped_column(String(64))  # HMAC-SHA256 (keyed) or SHA-256
    # Whether the appender had the audit key: informational (verification never trusts it).
    keyed: Mapped[bool] = mapped_column(Boolean)
