"""Tokens kept in the database (SPEC.md, section 7) and the audit rows of their grants.

- ``api_tokens``: one row per token made with ``cstp tokens create``: who it lets in (agent,
  workspace, role, scopes), when it was made and by whom, when it expires, when it was
  revoked, and the SHA-256 of its secret; never the secret. The database refuses to delete a
  row, and to update one except to set ``revoked_at`` once (revision 0013).
- ``api_token_grants``: one append-only row per creation and per revocation, covered by the
  audit chain; each carries what the token was granted (and its secret's SHA-256), so that
  a token row changed behind the server's back disagrees with its chained grants
  (app.audit.grants).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, CheckConstraint, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, UtcDateTime, workspace_column

CREATE = "create"
REVOKE = "revoke"


class ApiToken(Base):
    __tablename__ = "api_tokens"
    __table_args__ = (Index("ix_api_tokens_workspace_created_at", "workspace", "created_at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # tok_…, public
    workspace: Mapped[str] = workspace_column()
    agent: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))
    scopes: Mapped[list[str]] = mapped_column(JSON)  # in app.scopes.SCOPES order
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    created_by: Mapped[str] = mapped_column(String(128))  # the account that ran the command
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    secret_sha256: Mapped[str] = mapped_column(String(64), unique=True)  # lower-case hex


class ApiTokenGrant(Base):
    __tablename__ = "api_token_grants"
    __table_args__ = (CheckConstraint("action IN ('create', 'revoke')", name="action"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    token_id: Mapped[str] = mapped_column(ForeignKey("api_tokens.id"), index=True)
    workspace: Mapped[str] = workspace_column()
    action: Mapped[str] = mapped_column(String(8))  # create | revoke
    # What the token lets in, as granted (a revocation repeats it: each row reads alone).
    agent: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))
    scopes: Mapped[list[str]] = mapped_column(JSON)
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    secret_sha256: Mapped[str] = mapped_column(String(64))
    acted_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    acted_by: Mapped[str] = mapped_column(String(128))
