"""Auditors' SQL sessions on PostgreSQL: database roles that read one workspace's audit rows.

Revision 0012 installs row-level security on every audit table: a role listed in
``audit_readers`` sees the rows of its workspace only; ``cstp db auditor-role`` lists a role
there and grants it SELECT on the audit tables (docs/AUDIT.md). SQLite has no roles: the
table exists only on Postgres, and no model describes it.

What a reader may touch is decided here, in one transaction, so that no moment exists in
which the role holds SELECT but is not yet listed (a role that is not listed sees every
workspace):

- The audit tables are the tables of the connection's schema that carry the readers' policy,
  read from the catalog: a table without it would show every workspace, so it is never
  granted, and a table a later migration gives the policy is granted without a change here.
- The role is created ``LOGIN NOINHERIT`` (privileges granted to a group it is later put in
  do not silently widen what its sessions read), or brought to that; it is never a superuser,
  the tables' owner, a member of any role, or the role running the command (each of them is
  exempt from row-level security, or could SET ROLE to a role that may be).
- Every privilege it holds on the schema, its tables, sequences and functions is revoked
  before SELECT on the audit tables and USAGE on the schema are granted: nothing else.
- A password is sent as a SCRAM-SHA-256 verifier computed here, as psql's ``\\password``
  does, so the plaintext never reaches the server's statement log or pg_stat_activity.

Role names are checked against ``ROLE_NAME`` and still quoted by the dialect's identifier
preparer; values go as bound parameters, except the verifier, whose characters (base64,
digits, ``$``, ``:``) cannot end a string literal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.scopes import workspace_problem

TABLE = "audit_readers"
POLICY = "workspace_readers"  # the policy revision 0012 puts on each audit table
FUNCTION = "cstp_reader_workspace"  # what the policy calls: the current role's workspace

# Lower case only, so that the name an auditor types (``psql -U aud_w1``) is the role's name
# without quoting rules to remember; ``pg_`` names are reserved by PostgreSQL.
ROLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
RESERVED_ROLES = frozenset({"public", "none", "current_user", "session_user", "current_role"})

# Two runs of the command at once would both find the role missing and one would fail on
# CREATE ROLE: the second waits for the first instead (a transaction-scoped advisory lock).
LOCK_KEY = 0x63737470_72656164  # "cstp" "read"


class ReaderRefused(Exception):
    """The command cannot be done as asked; the message says why, in one line."""


@dataclass(frozen=True)
class Granted:
    role: str
    workspace: str
    previous: str | None  # the workspace it read before, None when it was not a reader
    created: bool
    changed: tuple[str, ...]  # the attributes set on an existing role (LOGIN, NOINHERIT...)
    password: bool
    schema: str
    tables: tuple[str, ...]


@dataclass(frozen=True)
class Revoked:
    role: str
    workspace: str
    schema: str


def check_role_name(role: str) -> None:
    if not ROLE_NAME.fullmatch(role) or role.startswith("pg_") or role in RESERVED_ROLES:
        raise ReaderRefused(
            f"{role!r} cannot be an auditor role's name: use 1 to 63 lower-case letters, "
            "digits and underscores, starting with a letter or an underscore, not 'pg_' and "
            "not a reserved name"
        )


def check_workspace(workspace: str) -> None:
    problem = workspace_problem(workspace)
    if problem is not None:
        raise ReaderRefused(f"{workspace!r} is not a workspace id: {problem}")


def check_password(password: str) -> None:
    """Printable ASCII only: SASLprep, which every client applies to a password before SCRAM,
    leaves such a password as it is, so the verifier computed here is the one they reach."""
    if not password or any(not " " <= c <= "~" for c in password):
        raise ReaderRefused(
            "the password must be non-empty printable ASCII (letters, digits, punctuation, spaces)"
        )


# ---- the catalog ----------------------------------------------------------------------------


async def _audit_tables(conn: AsyncConnection) -> tuple[str, tuple[str, ...], set[str]]:
    """The schema, its tables under the readers' policy, and their owners."""
    schema = await conn.scalar(text("SELECT current_schema()"))
    if schema is None:
        raise ReaderRefused("the connection has no current schema (check its search_path)")
    rows = (
        await conn.execute(
            text(
                "SELECT c.relname AS name, pg_get_userbyid(c.relowner) AS owner, "
                "c.relrowsecurity AS secured "
                "FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE p.polname = :policy AND n.nspname = :schema ORDER BY c.relname"
            ),
            {"policy": POLICY, "schema": schema},
        )
    ).all()
    reader_table = await conn.scalar(text("SELECT to_regclass(:name)"), {"name": TABLE})
    if not rows or reader_table is None:
        raise ReaderRefused(
            f"the schema {schema} has no row-level security for auditors (revision 0012 "
            "installs it): run `cstp db upgrade`"
        )
    unsecured = [row.name for row in rows if not row.secured]
    if unsecured:  # a policy on a table whose row-level security is off filters nothing
        raise ReaderRefused(
            f"row-level security is disabled on {', '.join(unsecured)}: no auditor role is "
            "granted until it is enabled again (ALTER TABLE ... ENABLE ROW LEVEL SECURITY)"
        )
    return schema, tuple(row.name for row in rows), {row.owner for row in rows}


async def _role(conn: AsyncConnection, role: str) -> Any:
    return (
        await conn.execute(
            text(
                "SELECT rolsuper, rolinherit, rolcreaterole, rolcreatedb, rolcanlogin, "
                "rolreplication, rolbypassrls FROM pg_roles WHERE rolname = :role"
            ),
            {"role": role},
        )
    ).first()


async def _refuse_exempt(
    conn: AsyncConnection, role: str, attributes: Any, owners: set[str]
) -> None:
    """Refuse a role that row-level security would not hold: whatever it was granted, it
    would read every workspace (or be able to become a role that does)."""
    me = (await conn.execute(text("SELECT current_user, session_user"))).one()
    if role in (me[0], me[1]):
        raise ReaderRefused(
            f"{role} is the role this command (and the server) connects as: an auditor "
            "needs a role of their own"
        )
    if attributes is None:
        return
    if attributes.rolsuper:
        raise ReaderRefused(
            f"{role} is a superuser, which row-level security does not apply to: choose "
            "another name"
        )
    if role in owners:
        raise ReaderRefused(
            f"{role} owns the audit tables, and row-level security does not apply to their "
            "owner: choose another name"
        )
    groups = await conn.scalar(
        text(
            "SELECT string_agg(m.roleid::regrole::text, ', ' ORDER BY m.roleid::regrole::text) "
            "FROM pg_auth_members AS m JOIN pg_roles AS r ON r.oid = m.member "
            "WHERE r.rolname = :role"
        ),
        {"role": role},
    )
    if groups:  # it could SET ROLE to one of them, and read (or write) as that role
        raise ReaderRefused(
            f"{role} is a member of {groups}: an auditor role is a member of no role "
            "(REVOKE the memberships first, or choose another name)"
        )


async def _revoke_all(conn: AsyncConnection, quoted: str, schema: str) -> None:
    q_schema = conn.dialect.identifier_preparer.quote_identifier(schema)
    for statement in (
        f"REVOKE ALL ON ALL TABLES IN SCHEMA {q_schema} FROM {quoted}",
        f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA {q_schema} FROM {quoted}",
        f"REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {q_schema} FROM {quoted}",
        f"REVOKE ALL ON SCHEMA {q_schema} FROM {quoted}",
    ):
        await conn.exec_driver_sql(statement)


WRITES = "INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER"


async def _check_privileges(
    conn: AsyncConnection, role: str, schema: str, tables: tuple[str, ...]
) -> None:
    """What the role can do now, whoever granted it: SELECT on each audit table and nothing
    more on the schema's tables. A REVOKE takes back only the grants its own role (or the
    owner) made, and a GRANT without the right to make it is a warning: neither may pass
    for done. (TRUNCATE, for one, is not subject to row-level security.)"""
    rows = (
        await conn.execute(
            text(
                "SELECT c.relname AS name, c.relname = ANY(CAST(:tables AS text[])) AS audit, "
                "has_table_privilege(:role, c.oid, 'SELECT') AS reads, "
                "has_table_privilege(:role, c.oid, :writes) "
                "OR has_any_column_privilege(:role, c.oid, 'INSERT, UPDATE, REFERENCES') "
                "AS writes, has_any_column_privilege(:role, c.oid, 'SELECT') AS columns "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = :schema AND c.relkind IN ('r', 'p', 'v', 'm', 'f') "
                "ORDER BY c.relname"
            ),
            {"role": role, "schema": schema, "tables": list(tables), "writes": WRITES},
        )
    ).all()
    unread = [r.name for r in rows if r.audit and not r.reads]
    if unread:
        raise ReaderRefused(
            f"SELECT on {', '.join(unread)} could not be granted to {role}: run the command "
            "as the tables' owner"
        )
    extra = [r.name for r in rows if r.writes or (not r.audit and r.columns)]
    if extra:
        raise ReaderRefused(
            f"{role} would still hold privileges on {', '.join(extra)} (granted by another "
            "role, or to PUBLIC): revoke them first; nothing was changed"
        )


# ---- the commands ---------------------------------------------------------------------------


async def grant_reader(
    conn: AsyncConnection, role: str, workspace: str, *, verifier: str | None = None
) -> Granted:
    """Make ``role`` (created if missing) a reader of ``workspace``'s audit rows, and nothing
    else, in the transaction of ``conn`` (the caller commits). ``verifier``: the role's new
    password as ``scram_verifier`` made it; None leaves the password as it is."""
    check_role_name(role)
    check_workspace(workspace)
    quote = conn.dialect.identifier_preparer.quote_identifier
    quoted = quote(role)
    await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": LOCK_KEY})
    schema, tables, owners = await _audit_tables(conn)
    attributes = await _role(conn, role)
    await _refuse_exempt(conn, role, attributes, owners)
    password = f" PASSWORD '{verifier}'" if verifier is not None else ""
    changed: list[str] = []
    if attributes is None:
        await conn.exec_driver_sql(f"CREATE ROLE {quoted} LOGIN NOINHERIT{password}")
    else:
        # Only what differs: PostgreSQL refuses a role without superuser even to repeat some
        # attributes (REPLICATION, BYPASSRLS) that are already as asked.
        wanted = {
            "LOGIN": not attributes.rolcanlogin,
            "NOINHERIT": attributes.rolinherit,
            "NOCREATEROLE": attributes.rolcreaterole,
            "NOCREATEDB": attributes.rolcreatedb,
            "NOREPLICATION": attributes.rolreplication,
            "NOBYPASSRLS": attributes.rolbypassrls,
        }
        changed = [name for name, needed in wanted.items() if needed]
        if changed or password:
            await conn.exec_driver_sql(f"ALTER ROLE {quoted} {' '.join(changed)}{password}")
    previous = await conn.scalar(
        text(f"SELECT workspace FROM {TABLE} WHERE role_name = :role"), {"role": role}
    )
    # Listed before it is granted anything, in the same transaction.
    await conn.execute(
        text(
            f"INSERT INTO {TABLE} (role_name, workspace) VALUES (:role, :workspace) "
            "ON CONFLICT (role_name) DO UPDATE SET workspace = excluded.workspace"
        ),
        {"role": role, "workspace": workspace},
    )
    await _revoke_all(conn, quoted, schema)
    q_schema = quote(schema)
    await conn.exec_driver_sql(f"GRANT USAGE ON SCHEMA {q_schema} TO {quoted}")
    names = ", ".join(f"{q_schema}.{quote(table)}" for table in tables)
    await conn.exec_driver_sql(f"GRANT SELECT ON {names} TO {quoted}")
    # The policies call the function as the reader: EXECUTE is PUBLIC's by default, granted
    # here too so that a database that took it from PUBLIC still lets readers read.
    await conn.exec_driver_sql(
        f"GRANT EXECUTE ON FUNCTION {q_schema}.{quote(FUNCTION)}(text) TO {quoted}"
    )
    await _check_privileges(conn, role, schema, tables)
    return Granted(
        role=role,
        workspace=workspace,
        previous=previous,
        created=attributes is None,
        changed=tuple(changed),
        password=verifier is not None,
        schema=schema,
        tables=tables,
    )


async def revoke_reader(conn: AsyncConnection, role: str) -> Revoked:
    """Take back what ``grant_reader`` gave ``role``: its privileges on the schema, its place
    in ``audit_readers`` and its LOGIN, in the transaction of ``conn``. The role itself is
    left (it may own objects or hold grants elsewhere): DROP ROLE is the operator's."""
    check_role_name(role)
    quoted = conn.dialect.identifier_preparer.quote_identifier(role)
    await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": LOCK_KEY})
    schema, tables, _owners = await _audit_tables(conn)
    workspace = await conn.scalar(
        text(f"SELECT workspace FROM {TABLE} WHERE role_name = :role"), {"role": role}
    )
    if workspace is None:
        raise ReaderRefused(f"{role} is not an auditor role (it is not listed in {TABLE})")
    if await _role(conn, role) is not None:
        # Privileges first: a role still granted SELECT but no longer listed would read
        # every workspace (the transaction makes the order invisible; it is kept anyway).
        await _revoke_all(conn, quoted, schema)
        await conn.exec_driver_sql(f"ALTER ROLE {quoted} NOLOGIN")
        kept = await conn.scalar(
            text(
                "SELECT string_agg(t, ', ') FROM unnest(CAST(:tables AS text[])) AS t "
                "WHERE has_table_privilege(:role, "
                "format('%I.%I', CAST(:schema AS text), t), 'SELECT')"
            ),
            {"role": role, "schema": schema, "tables": list(tables)},
        )
        if kept:  # unlisted, it would read every workspace: it stays a reader instead
            raise ReaderRefused(
                f"{role} would still read {kept} (granted by another role, or to PUBLIC): "
                "revoke that first; nothing was changed"
            )
    await conn.execute(text(f"DELETE FROM {TABLE} WHERE role_name = :role"), {"role": role})
    return Revoked(role=role, workspace=workspace, schema=schema)
