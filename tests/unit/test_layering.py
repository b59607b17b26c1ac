"""The layers hold: nothing below the faces imports a face, no module imports itself round a
cycle, no package does either, and the migrations are frozen. The faces (JSON-RPC in app/rpc,
MCP in app/mcp, the HTTP system routes, the command line, the app factory) sit on top of the
operations and the domain contexts; a context that imported a face would drag that face into
every other one. A cycle, even one dodged with an import inside a function, means two modules
that cannot be understood (or loaded) apart; between packages (app.decisions imports app.search,
which imports app.decisions back through other modules), two contexts that cannot be changed
apart. A migration describes the schema as it was at its revision: code it imported from the
contexts could change what an old upgrade does.

Imports only for annotations (inside ``if TYPE_CHECKING:``) are left out of both cycle checks:
they are never executed, so they load nothing and order nothing at run time, and an annotation
naming a type of a higher layer (``Services``) is how a lower one says what it is handed."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"
FACES = (
    "app.rpc",
    "app.mcp",
    "app.system",
    "app.cli",
    "app.asgi",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(APP.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes inside ``if TYPE_CHECKING:`` blocks (imports for annotations)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                skipped.update(id(n) for n in ast.walk(inner))
    return skipped


def imported(path: Path, *, runtime_only: bool = False, package: str | None = None) -> set[str]:
    """Every module ``path`` imports, anywhere in it (functions included), absolute; with
    ``runtime_only``, not those imported only for type checking. ``package`` is the one
    relative imports start from (by default, found from the path under app/)."""
    if package is None:
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_only(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def is_face(name: str) -> bool:
    return any(name == face or name.startswith(face + ".") for face in FACES)


def test_no_module_below_the_faces_imports_a_face() -> None:
    below = [p for p in APP.rglob("*.py") if not is_face(module_name(p))]
    assert len(below) > 40  # the contexts, operations, db, outbox, ...
    offenders = {module_name(p): sorted(n for n in imported(p) if is_face(n)) for p in below}
    assert {m: faces for m, faces in offenders.items() if faces} == {}


def test_the_checker_sees_relative_and_function_level_imports(tmp_path: Path) -> None:
    """The check itself can fail: a relative import of a face inside a function is found."""
    sample = APP / "decisions" / "service.py"
    names = imported(sample)
    assert "app.operations.context" in names  # absolute, at the top
    assert "app.decisions.document" in names  # relative: from . import document
    assert is_face("app.rpc.errors") and is_face("app.mcp") and not is_face("app.rpcx")


def import_graph() -> dict[str, set[str]]:
    """app's modules -> the app modules each imports at run time (a name imported from a
    package counts as that package's module when it is one)."""
    modules = {module_name(p): p for p in APP.rglob("*.py")}
    return {
        name: {m for m in imported(path, runtime_only=True) if m in modules and m != name}
        for name, path in modules.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative), each sorted: every import cycle is inside one of them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_cycles_between_modules() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle_and_ignores_type_checking_imports(
    tmp_path: Path,
) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from app.rpc import errors\n"
        "def f():\n    from app.db import models\n"
    )
    assert "app.db.models" in imported(sample, runtime_only=True, package="app.x")
    assert "app.rpc.errors" not in imported(sample, runtime_only=True, package="app.x")
    assert "app.rpc.errors" in imported(sample, package="app.x")


# ---------------------------------------------------------------- packages


def package_of(module: str) -> str:
    """The node of ``module`` in the package graph: app's package it belongs to
    (``app.decisions.service`` -> ``app.decisions``), or itself for a top-level module
    (``app.config``)."""
    return ".".join(module.split(".")[:2])


def package_graph(
    graph: dict[str, set[str]],
) -> tuple[dict[str, set[str]], dict[tuple[str, str], list[tuple[str, str]]]]:
    """app's packages -> the packages they import at run time, and for each edge the module
    imports that make it. A package's imports of its own modules are not edges. The
    migrations are left out: Alembic loads them by path, never the running server;
    ``test_migrations_are_frozen`` holds them to their own rule."""
    packages: dict[str, set[str]] = {}
    why: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for module, targets in graph.items():
        if module.startswith(MIGRATIONS_PACKAGE):
            continue
        source = package_of(module)
        packages.setdefault(source, set())
        for target in targets:
            if package_of(target) != source:
                packages[source].add(package_of(target))
                why.setdefault((source, package_of(target)), []).append((module, target))
    return packages, why


def package_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each strongly connected component of more than one package, told with the module
    imports between its members."""
    packages, why = package_graph(graph)
    told = []
    for component in cycles(packages):
        edges = sorted(
            f"{module} -> {target}"
            for (source, dest), pairs in why.items()
            if source in component and dest in component
            for module, target in pairs
        )
        told.append(f"{' <-> '.join(component)}: " + "; ".join(edges))
    return told


def test_no_import_cycles_between_packages() -> None:
    packages, _ = package_graph(import_graph())
    assert {"app.decisions", "app.search", "app.outbox", "app.records"} <= set(packages)
    assert package_cycles(import_graph()) == []


def test_the_package_check_finds_a_cycle_through_other_modules() -> None:
    """A cycle no module check sees: each module imports another one of the other package."""
    graph = {
        "app.a.one": {"app.b.two"},
        "app.b.two": set(),
        "app.b.three": {"app.c"},
        "app.c": {"app.a.four"},
        "app.a.four": set(),
        "app.db.migrations.versions.x": {"app.a.one"},
    }
    assert cycles(graph) == []
    (found,) = package_cycles(graph)
    assert found.startswith("app.a <-> app.b <-> app.c: ")
    assert "app.b.three -> app.c" in found and "app.c -> app.a.four" in found
    assert "migrations" not in found


# ---------------------------------------------------------------- migrations

MIGRATIONS_PACKAGE = "app.db.migrations"
VERSIONS = APP / "db" / "migrations" / "versions"
# What a migration may import of app: DDL helpers of app.db that exist for the migrations and
# only ever grow (a new helper, or a new argument with the old default), so that what they
# give a revision already written never changes. Anything else (a context, app.config, the
# models) is copied into the migration as it was at its revision.
STABLE_HELPERS = frozenset(
    {
        "app.db.triggers",  # the append-only and refuse-replace triggers' DDL
        "app.db.fulltext",  # the keyword index's DDL
        "app.db.base",  # UtcDateTime, the column type every timestamp is stored as
    }
)


def _allowed_in_a_migration(name: str) -> bool:
    return not (name == "app" or name.startswith("app.")) or any(
        name == helper or name.startswith(helper + ".") for helper in STABLE_HELPERS
    )


def migration_offenders(versions: Path) -> dict[str, list[str]]:
    """Each migration in ``versions`` with what it imports of app beyond the stable helpers
    (``from app.db import triggers`` counts as ``app.db.triggers``)."""
    offenders: dict[str, list[str]] = {}
    for path in sorted(versions.glob("*.py")):
        names = imported(path, package="app.db.migrations.versions")
        # ``from app.db import triggers`` names the package too; the helper is what it takes.
        taken = {n for n in names if not any(m.startswith(n + ".") for m in names)}
        bad = sorted(n for n in taken if not _allowed_in_a_migration(n))
        if bad:
            offenders[path.name] = bad
    return offenders


def test_migrations_are_frozen() -> None:
    assert len(list(VERSIONS.glob("*.py"))) >= 11
    assert migration_offenders(VERSIONS) == {}


def test_the_migration_check_sees_a_live_import(tmp_path: Path) -> None:
    (tmp_path / "0001_ok.py").write_text(
        "import sqlalchemy as sa\nfrom app.db import triggers\n"
        "from app.db.base import UtcDateTime\n"
    )
    (tmp_path / "0002_live.py").write_text(
        "from app.db import triggers\ndef upgrade():\n    from app.audit import chain\n"
    )
    (tmp_path / "0003_config.py").write_text("from app.config import audit_key_from_env\n")
    assert migration_offenders(tmp_path) == {
        "0002_live.py": ["app.audit.chain"],
        "0003_config.py": ["app.config.audit_key_from_env"],
    }
