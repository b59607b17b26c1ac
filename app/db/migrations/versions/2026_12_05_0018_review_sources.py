"""Where an outcome comes from, and the recording-time quality flags (SPEC.md, section 9).

- ``decision_reviews.source``: ``agent`` (reviewDecision: the agent's own claim), ``human``
  (a person, in the console) or ``ci`` (observed by CI); the reviews stored before are the
  agents' (``agent``).
- ``decisions.review_source``: the latest review's source, copied like its other review
  columns (so calibration can take one source without a join); filled for the reviewed
  decisions stored before.
- ``decisions.quality_flags``: what the check at recording time found (``not_a_decision``);
  NULL when nothing was flagged.

All added in place on SQLite (nullable, or with a default). Revision 0010's trigger freezes the
columns of its day only, so the review columns added here change with each review.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "decision_reviews",
        sa.Column("source", sa.String(8), nullable=False, server_default="agent"),
    )
    op.add_column("decisions", sa.Column("review_source", sa.String(8), nullable=True))
    op.add_column("decisions", sa.Column("quality_flags", sa.JSON(), nullable=True))
    op.execute("UPDATE decisions SET review_source = 'agent' WHERE outcome IS NOT NULL")


def downgrade() -> None:
    bind = op.get_bind()
    kept = bind.execute(
        sa.text(
            "SELECT (SELECT COUNT(*) FROM decision_reviews WHERE source <> 'agent') "
            "+ (SELECT COUNT(*) FROM decisions WHERE quality_flags IS NOT NULL)"
        )
    ).scalar()
    if kept:
        raise RuntimeError(
            "cannot downgrade below revision 0018: reviews by a person or by CI, or quality "
            "flags, are stored; they are covered by the audit chain, and revision 0017 has "
            "no place for them"
        )
    # In place on both databases (no index or trigger names these columns).
    op.drop_column("decisions", "quality_flags")
    op.drop_column("decisions", "review_source")
    op.drop_column("decision_reviews", "source")
