"""The canonical YAML file of a decision, written atomically.

Canonical: fixed key order, no empty keys, UTF-8, block style, and byte-identical output for
the same row, so exporting again changes nothing and diffs of the tree stay meaningful.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from app.db.decisions import Decision

from .document import export_fields, relative_path

# libyaml's emitter when PyYAML was built with it (its wheels are): ~6x faster, and it gave
# byte-identical output to the pure-Python one on every document we compared.
try:
    from yaml import CSafeDumper as _SafeDumper
except ImportError:  # PyYAML without libyaml: the pure-Python emitter, with the same interface
    from yaml import SafeDumper as _SafeDumper  # type: ignore[assignment]  # another class, same interface


class _CanonicalDumper(_SafeDumper):
    """SafeDumper that never emits aliases (each mapping stands on its own)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(decision: Decision) -> bytes:
    text = yaml.dump(
        export_fields(decision),
        Dumper=_CanonicalDumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
        width=100,
    )
    return text.encode("utf-8")


def target_path(root: Path, decision: Decision) -> Path:
    """The file under ``root`` (CSTP_DECISIONS_DIR); built only from the row's date and id."""
    rel = relative_path(decision).removeprefix("decisions/")
    return root / rel


def _file_mode() -> int:
    """What an ordinary new file gets under this process's umask (0644 under the usual 022):
    ``mkstemp`` makes its file 0600 whatever the umask, which no reader in another account or
    container could open. Read once, at import, while no other thread can change the umask."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


FILE_MODE = _file_mode()


def write_atomic(path: Path, content: bytes) -> bool:
    """Replace ``path`` with ``content`` via a temp file + rename; False when already equal."""
    try:
        if path.read_bytes() == content:
            return False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".yaml", dir=path.parent)
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return True


def export_decision(root: Path, decision: Decision) -> Path:
    path = target_path(root, decision)
    write_atomic(path, render(decision))
    return path
