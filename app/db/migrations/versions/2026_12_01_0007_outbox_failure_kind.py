"""Outbox events record the kind of their last failure, and count the failures of unknown
kind; dead events that died of an outage are revived.

Until this revision every failed attempt counted toward ``CSTP_OUTBOX_MAX_ATTEMPTS``, so an
index outage of a few minutes left its events ``dead``. Now only an event that can never
succeed as it is (its decision cannot be rendered, its row is gone) is dead; the upgrade
gives every other dead event back to the relay (pending, due now, counters reset) and marks
the ones that stay dead ``permanent``. The downgrade drops the two columns and leaves the
rows as they are.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

import re
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What the relay of revisions 0001-0006 wrote to last_error, by cause: "decision not found",
# "unknown event kind 'x'", "export failed: <OSError's strerror, or the exception's type
# name>", "vector index unavailable", "index failed: <type name>". An export that failed with
# a type name other than an OSError's came from rendering the YAML: permanent. The rest was
# an outage (or unknown) and is retried.
_OS_ERRORS = {
    "OSError",
    "IOError",
    "EnvironmentError",
    "BlockingIOError",
    "ChildProcessError",
    "ConnectionError",
    "BrokenPipeError",
    "ConnectionAbortedError",
    "ConnectionRefusedError",
    "ConnectionResetError",
    "FileExistsError",
    "FileNotFoundError",
    "InterruptedError",
    "IsADirectoryError",
    "NotADirectoryError",
    "PermissionError",
    "ProcessLookupError",
    "TimeoutError",
    "MemoryError",
}


def permanent(last_error: str | None) -> bool:
    """Whether a dead event's last_error (as the old relay wrote it) says it can never
    succeed as it is."""
    if last_error is None:
        return False
    if last_error == "decision not found" or last_error.startswith("unknown event kind"):
        return True
    rendering = re.fullmatch(r"export failed: (\w+)", last_error)
    return rendering is not None and rendering.group(1) not in _OS_ERRORS


def upgrade() -> None:
    with op.batch_alter_table("outbox_events") as batch:
        batch.add_column(sa.Column("failure_kind", sa.String(16), nullable=True))
        batch.add_column(
            sa.Column("unknown_failures", sa.Integer(), nullable=False, server_default="0")
        )
    bind = op.get_bind()
    dead = bind.execute(
        sa.text("SELECT id, last_error FROM outbox_events WHERE status = 'dead'")
    ).all()
    stay = [row.id for row in dead if permanent(row.last_error)]
    revive = [row.id for row in dead if not permanent(row.last_error)]
    for start in range(0, len(stay), 500):
        bind.execute(
            sa.text(
                "UPDATE outbox_events SET failure_kind = 'permanent' WHERE id IN :ids"
            ).bindparams(sa.bindparam("ids", expanding=True)),
            {"ids": stay[start : start + 500]},
        )
    for start in range(0, len(revive), 500):
        # Due at once: created_at is in the past, and stored in the column's own format.
        bind.execute(
            sa.text(
                "UPDATE outbox_events SET status = 'pending', attempts = 0, unknown_failures = 0,"
                " available_at = created_at WHERE id IN :ids"
            ).bindparams(sa.bindparam("ids", expanding=True)),
            {"ids": revive[start : start + 500]},
        )


def downgrade() -> None:
    with op.batch_alter_table("outbox_events") as batch:
        batch.drop_column("unknown_failures")
        batch.drop_column("failure_kind")
