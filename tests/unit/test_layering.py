"""The layers hold: nothing below the faces imports a face. The faces (JSON-RPC in app/rpc,
MCP in app/mcp, the HTTP system routes, the command line, the app factory) sit on top of
the operations and the domain contexts; a context that imported a face would drag that face
into every other one."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"
FACES = ("app.rpc", "app.mcp", "app.system", "app.client", "app.cli", "app.cli_support", "app.asgi")


def module_name(path: Path) -> str:
    parts = path.relative_to(APP.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it (functions included), absolute."""
    package = (
        module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    )
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
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
