"""SQL lives in repositories: a statement is built, and rows are read or written, only in a
context's ``repository.py`` (or ``repository/`` package) or under app/db/ (engine, models,
migrations, full-text and trigger DDL). Services take a session and call their repository;
they never build a query of their own, so every statement a context runs can be read (and
tuned) in one module.

What counts as building or running a query, anywhere else in app/:
- importing a statement or expression builder from SQLAlchemy (``select``, ``insert``,
  ``update``, ``delete``, ``text``, ``func``, ``exists``, ``union``, ``bindparam``,
  ``literal_column``, ``and_``/``or_``, ``case``, ...), or using one as an attribute of an
  imported SQLAlchemy module (``sa.select``, ``postgresql.insert``);
- calling ``execute``/``exec_driver_sql``/``executemany``/``executescript`` on anything, or
  the reads and unit-of-work writes of a session or connection (``scalar``, ``scalars``,
  ``stream``, ``get``, ``add``, ``add_all``, ``delete``, ``merge``);
- a string (plain or f-string) that starts like SQL (``SELECT``, ``INSERT``, ``BEGIN``, ...).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"

# Where SQL may live besides repositories and app/db/, each with why: a module's path, or a
# prefix naming a folder. An entry that covers no module building SQL any more is an error:
# remove it when its modules have moved their SQL out.
ALLOWED: dict[str, str] = {
    "app/audit/snapshot.py": (
        "engine plumbing: the BEGIN of the read-only snapshot engine's transactions, in its "
        "begin hook, as app/db/engine.py does for the server's engines"
    ),
}

BUILDERS = frozenset(
    {
        "select",
        "insert",
        "update",
        "delete",
        "text",
        "func",
        "exists",
        "union",
        "union_all",
        "intersect",
        "except_",
        "bindparam",
        "literal",
        "literal_column",
        "column",
        "table",
        "values",
        "and_",
        "or_",
        "not_",
        "case",
        "null",
        "true",
        "false",
        "cast",
        "type_coerce",
        "tuple_",
        "distinct",
        "join",
        "outerjoin",
        "lateral",
        "over",
        "within_group",
    }
)
RUNS_SQL = frozenset({"execute", "exec_driver_sql", "executemany", "executescript"})
ROW_WORK = frozenset(
    {"scalar", "scalars", "stream", "stream_scalars", "get", "add", "add_all", "delete", "merge"}
)
DATABASE_HANDLE = re.compile(r"(session|conn|connection)$")
SQL_TEXT = re.compile(
    r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH|PRAGMA|CREATE|DROP|ALTER|BEGIN|COMMIT|SAVEPOINT|"
    r"RELEASE|ROLLBACK)\b"
)


def relative(path: Path) -> str:
    return path.relative_to(APP.parent).as_posix()


def allowed_without_entry(rel: str) -> bool:
    parts = rel.split("/")
    return rel.startswith("app/db/") or "repository" in parts or parts[-1] == "repository.py"


def entry_for(rel: str) -> str | None:
    return next((e for e in ALLOWED if rel.startswith(e)), None)


def _leading_text(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value
    return None


def queries(source: str, filename: str = "<module>") -> list[str]:
    """Where ``source`` builds or runs a query: ``line: what`` for each."""
    tree = ast.parse(source, filename)
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and n.body
        and isinstance(n.body[0], ast.Expr)
    }
    modules: set[str] = set()  # names bound to a SQLAlchemy module
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "sqlalchemy":
                    modules.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy"):
            for alias in node.names:
                if alias.name in BUILDERS:
                    found.append(f"{node.lineno}: imports {alias.name} from {node.module}")
                elif alias.name[:1].islower():  # a module (dialects.postgresql, sql, ...)
                    modules.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in BUILDERS
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
        ):
            found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name, receiver = node.func.attr, ast.unparse(node.func.value)
            if name in RUNS_SQL or (name in ROW_WORK and DATABASE_HANDLE.search(receiver)):
                found.append(f"{node.lineno}: {receiver}.{name}(...)")
        elif isinstance(node, ast.Constant | ast.JoinedStr) and id(node) not in docstrings:
            leading = _leading_text(node)
            if leading is not None and SQL_TEXT.match(leading):
                found.append(f"{node.lineno}: SQL text {leading.strip()[:30]!r}")
    return sorted(set(found), key=lambda f: (int(f.split(":")[0]), f))


def offenders() -> dict[str, list[str]]:
    """app's modules outside the allowed places that build or run a query."""
    out: dict[str, list[str]] = {}
    for path in sorted(APP.rglob("*.py")):
        rel = relative(path)
        if allowed_without_entry(rel):
            continue
        found = queries(path.read_text(), str(path))
        if found:
            out[rel] = found
    return out


def test_queries_are_built_only_in_repositories_and_app_db() -> None:
    unlisted = {m: f for m, f in offenders().items() if entry_for(m) is None}
    assert unlisted == {}, (
        "a query built outside a repository: move it into the context's repository.py"
    )


def test_every_allowance_still_covers_a_module_that_builds_sql() -> None:
    used = {entry_for(m) for m in offenders()}
    assert sorted(set(ALLOWED) - used) == []  # stale: remove the entry


def test_the_check_sees_builders_runs_and_raw_sql() -> None:
    """The check itself can fail: each way of building or running a query is found, and
    look-alikes (a YAML scalar, a docstring) are not."""
    sample = '''
"""SELECT in a docstring is prose."""
import sqlalchemy as sa
from sqlalchemy import Connection, func
from sqlalchemy.dialects import postgresql

def f(conn: Connection, session, parser, table):
    sa.select(table)
    postgresql.insert(table)
    conn.exec_driver_sql("BEGIN")
    session.add(table)
    parser.scalar(table)
    raw = f"SELECT 1 FROM {table}"
    return func, raw
'''
    found = queries(sample)
    assert [f.split(": ", 1)[1] for f in found] == [
        "imports func from sqlalchemy",
        "sa.select",
        "postgresql.insert",
        "SQL text 'BEGIN'",
        "conn.exec_driver_sql(...)",
        "session.add(...)",
        "SQL text 'SELECT 1 FROM'",
    ]
    assert allowed_without_entry("app/intents/repository.py")
    assert allowed_without_entry("app/audit/repository/chain.py")
    assert allowed_without_entry("app/db/models.py")
    assert not allowed_without_entry("app/intents/service.py")
