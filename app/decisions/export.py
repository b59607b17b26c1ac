"""The canonical YAML file of a decision, written atomically.

Canonical: fixed key order, no empty keys, UTF-8, block style, and byte-identical output for
the same row, so exporting again changes nothing and diffs of the tree stay meaningful.

A file is never replaced by one rendered from an older version of its row. A decision changes
only when it is reviewed, and two passes may export it at once (the review's own pass and the
relay retrying an earlier review's event, say), each with the row as it read it; whichever
renamed last would win. The file carries no review id, but its ``reviewed_at`` stands in for
one: a review is made under its decision's row lock, and its time is later than that of every
review before it (app.decisions.reviews), so ``reviewed_at`` grows with the id, which is what
makes a review the latest (app.decisions.repository, "which review is the latest"). So the
write compares ``reviewed_at``: a file whose review is later than the row's was written from a
newer row, and stays.

A file that shows another review than its row's all the same (edited by hand, or left by a
server that took review times before the lock) is written again by ``cstp export``
(``repair``: app.decisions.bulk).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from app.db.decisions import Decision
from app.outbox.handlers import Exports

from .document import export_fields, relative_path
from .repository import changed_rows

# libyaml's emitter when PyYAML was built with it (its wheels are): ~6x faster, and it gave
# byte-identical output to the pure-Python one on every document we compared.
try:
    from yaml import CSafeDumper as _SafeDumper
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # PyYAML without libyaml: the pure-Python ones, with the same interface
    from yaml import SafeDumper as _SafeDumper  # type: ignore[assignment]  # another class, same interface
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]  # another class, same interface


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


# One process's exports compare and replace a file one at a time (a read-compare-rename of a
# file under a millisecond; exports of different files gain nothing from running together).
_WRITE_LOCK = threading.Lock()


def _review_time(content: bytes) -> datetime | None:
    """The ``reviewed_at`` a stored file holds; None when it has none or it cannot be read
    (a file edited into something else is replaced by the row's)."""
    try:
        fields = yaml.load(content, Loader=_SafeLoader)  # the safe loader
        value = fields.get("reviewed_at") if isinstance(fields, dict) else None
        stored = datetime.fromisoformat(value) if isinstance(value, str) else value
    except (yaml.YAMLError, ValueError, TypeError):
        return None
    if not isinstance(stored, datetime):
        return None
    return stored if stored.tzinfo is not None else stored.replace(tzinfo=UTC)  # as the rows


def write_decision(root: Path, decision: Decision, content: bytes, *, repair: bool = False) -> bool:
    """Write ``content`` (rendered from ``decision``) as its file; False when the file already
    holds it, or holds a later review than ``decision`` has (see the module docstring) and
    this is no ``repair``."""
    path = target_path(root, decision)
    with _WRITE_LOCK:
        try:
            current = path.read_bytes()
        except FileNotFoundError:
            current = None
        if current is not None and current != content and not repair:
            stored = _review_time(current)
            if stored is not None and (
                decision.reviewed_at is None or stored > decision.reviewed_at
            ):
                return False
        return write_atomic(path, content)


def export_decision(root: Path, decision: Decision) -> Path:
    write_decision(root, decision, render(decision))
    return target_path(root, decision)


def decision_exports() -> Exports:
    """What the outbox relay delivers of a decision, handed to it by app.services: the
    relay's handlers do not import this context (which imports the relay)."""
    return Exports(render=render, write=write_decision, changed_rows=changed_rows)
