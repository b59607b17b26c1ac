"""``cstp webhooks ci-secret``: a workspace's CI signing secret, made, sealed and stored
(local, with database access, like ``cstp webhooks add``). Never on a call's path."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from app.db.ci import CiSecret
from app.webhooks.secrets import key_id, load_key, new_secret, seal

from . import repository

if TYPE_CHECKING:
    from app.config import Settings
    from app.db.engine import Database


def sealed_for(workspace: str) -> str:
    """The associated data a workspace's CI secret is sealed with: a sealed secret copied
    onto another workspace's row, or onto a webhook subscription's, does not open."""
    return f"ci:{workspace}"


async def set_secret(
    db: Database, settings: Settings, workspace: str, by: str, now: datetime
) -> str:
    """A new CI secret for ``workspace`` (``whsec_…``), stored sealed in place of the one
    before, which stops working when this commits. Raises KeyUnavailable."""
    key = load_key(settings)
    secret = new_secret()
    row = CiSecret(
        workspace=workspace,
        secret_sealed=seal(key, sealed_for(workspace), secret),
        key_id=key_id(key),
        created_at=now,
        created_by=by,
    )
    async with db.transaction(write=True) as session:
        await repository.put_secret(session, row)
    return secret
