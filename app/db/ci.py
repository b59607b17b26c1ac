"""Outcomes observed by CI (SPEC.md, section 9): ``POST /hooks/ci/<workspace>``.

- ``ci_secrets``: one row per workspace that CI may report to: its Standard Webhooks signing
  secret, sealed with AES-256-GCM under the webhook key kept outside the database
  (app/webhooks/secrets.py; ``key_id`` names that key without revealing it), and who set it
  when. ``cstp webhooks ci-secret`` replaces it (rotation).
- ``ci_deliveries``: the ``webhook-id`` of every accepted CI report, per workspace, so that a
  replay of one is refused; written in the transaction of the reviews it made, so a report
  cannot review twice. Kept well past the signature's five-minute tolerance (after it, a
  replay fails on its timestamp anyway), then pruned by the hook itself.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base, UtcDateTime


class CiSecret(Base):
    __tablename__ = "ci_secrets"

    workspace: Mapped[str] = mapped_column(String(63), primary_key=True)
    # base64 of the 12-byte nonce and the AES-GCM ciphertext of the secret's text
    secret_sealed: Mapped[str] = mapped_column(Text)
    key_id: Mapped[str] = mapped_column(String(16))  # the sealing key's fingerprint
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    created_by: Mapped[str] = mapped_column(String(128))  # the account that ran the command


class CiDelivery(Base):
    __tablename__ = "ci_deliveries"
    # The pruning's range: the ids signed before the retention window.
    __table_args__ = (Index("ix_ci_deliveries_signed_at", "signed_at"),)

    workspace: Mapped[str] = mapped_column(String(63), primary_key=True)
    message_id: Mapped[str] = mapped_column(String(128), primary_key=True)  # webhook-id
    signed_at: Mapped[datetime] = mapped_column(UtcDateTime)  # its webhook-timestamp
    received_at: Mapped[datetime] = mapped_column(UtcDateTime)
    pr: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(8))  # success | failure, as reported
    reviewed: Mapped[int] = mapped_column(Integer)  # how many decisions it reviewed
