"""SQL that makes a table append-only: the database itself refuses UPDATE and DELETE.

Used by migrations; kept stable, since old migrations import it.
"""

from __future__ import annotations

PG_FUNCTION = "cstp_refuse_change"


def install(dialect: str, table: str) -> list[str]:
    if dialect == "sqlite":
        return [
            f"CREATE TRIGGER trg_{table}_no_{verb.lower()} BEFORE {verb} ON {table} "
            f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
            for verb in ("UPDATE", "DELETE")
        ]
    return [
        f"CREATE OR REPLACE FUNCTION {PG_FUNCTION}() RETURNS trigger AS $$ BEGIN "
        f"RAISE EXCEPTION '% is append-only', TG_TABLE_NAME; END $$ LANGUAGE plpgsql",
        f"CREATE TRIGGER trg_{table}_append_only BEFORE UPDATE OR DELETE ON {table} "
        f"FOR EACH ROW EXECUTE FUNCTION {PG_FUNCTION}()",
    ]


def remove(dialect: str, table: str) -> list[str]:
    if dialect == "sqlite":
        return [f"DROP TRIGGER IF EXISTS trg_{table}_no_{v}" for v in ("update", "delete")]
    return [f"DROP TRIGGER IF EXISTS trg_{table}_append_only ON {table}"]


def refuse_replace(
    dialect: str, table: str, also_when: str | None = None, *, key: str = "id"
) -> list[str]:
    """SQLite only: refuse an INSERT that would collide with a row already there.

    ``REPLACE`` (and ``INSERT OR REPLACE``) resolves a collision by deleting the old row, and
    that implicit delete fires no DELETE trigger unless the connection turned
    ``recursive_triggers`` on: without this trigger a row could be rewritten in place. A
    BEFORE INSERT trigger runs before any conflict is resolved, whatever the pragmas, so it
    refuses the statement while the old row is still there. ``also_when`` adds the collision
    on a table's other unique keys (an SQL condition on ``NEW``); ``key`` names the primary
    key's column when it is not ``id``. Postgres has no REPLACE,
    and its upsert (``ON CONFLICT DO UPDATE``) is an UPDATE, refused by the trigger above.
    """
    if dialect != "sqlite":
        return []
    collides = f"EXISTS (SELECT 1 FROM {table} WHERE {key} = NEW.{key})"
    if also_when:
        collides = f"{collides} OR ({also_when})"
    return [
        f"CREATE TRIGGER trg_{table}_no_replace BEFORE INSERT ON {table} WHEN {collides} "
        f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
    ]


def remove_refuse_replace(dialect: str, table: str) -> list[str]:
    return [f"DROP TRIGGER IF EXISTS trg_{table}_no_replace"] if dialect == "sqlite" else []
