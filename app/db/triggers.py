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
