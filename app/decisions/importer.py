"""Load a tree of decision YAML files into the database (``cstp import DIR``).

Each file is read by app.decisions.import_file (the layout of docs/PROTOCOL.md, "Decision
files", which other decision journals also write); a file that cannot be read, or whose values
no column could hold, is reported with the reason and skipped, and the other files are imported.
Idempotent: a decision whose id is already stored is left alone. Imported decisions get their
YAML export and index entry through the outbox, like any other write.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.exc import SQLAlchemyError

from app.db.base import DEFAULT_WORKSPACE
from app.db.decisions import Decision

from . import repository
from .import_file import parse_file
from .import_limits import Unreadable

if TYPE_CHECKING:
    from app.services import Services

log = logging.getLogger("cstp.import")


class TakenElsewhere(Exception):
    """A decision's id is already stored in another workspace (ids are unique across all)."""


Progress = Callable[[int, int], None]
BATCH = 200


@dataclass
class ImportReport:
    files: int = 0
    new: int = 0
    existing: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    new_ids: list[str] = field(default_factory=list)  # the decisions this import added


def find_files(root: Path) -> list[Path]:
    """The entries named ``*.yaml`` or ``*.yml`` under ``root``, and the symbolic links met on
    the way (to a file or a folder), which are listed, not followed: an import reads nothing
    outside its tree. Only regular files are opened (app.decisions.import_limits): a named
    pipe, socket or device among them is listed as such, and skipped."""
    found: list[Path] = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        base = Path(folder)
        found.extend(base / d for d in dirs if (base / d).is_symlink())
        found.extend(base / f for f in files if Path(f).suffix in {".yaml", ".yml"})
    return sorted(found)


# What an import fills: their statistics are refreshed once it is done (Database.analyze).
IMPORTED_TABLES = (
    "decisions",
    "decision_reasons",
    "decision_tags",
    "decision_reviews",
    "decision_search",
    "audit_chain",
)


def _chunks(items: list[Path], size: int) -> Iterator[list[Path]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


async def import_tree(
    services: Services,
    root: Path,
    progress: Progress | None = None,
    *,
    workspace: str = DEFAULT_WORKSPACE,
) -> ImportReport:
    """Import every YAML file under ``root`` into ``workspace``, BATCH files per transaction.
    A file that cannot be read, or that the database refuses, is listed in the report with
    the reason (a file naming another workspace is one); the others are imported all the
    same."""
    files = find_files(root)
    report = ImportReport(files=len(files))
    categories = services.settings.categories
    max_bytes = services.settings.max_body_bytes
    done = 0

    def parsed_or_listed(path: Path) -> Decision | None:
        try:
            return parse_file(path, categories, max_bytes, workspace)
        except Unreadable as exc:
            reason = str(exc)
        except OSError as exc:
            reason = exc.strerror or "unreadable"
        except Exception as exc:  # one odd file must not stop the import
            log.warning("import of %s failed", path, exc_info=True)
            reason = f"cannot be imported ({type(exc).__name__})"
        report.failed.append((str(path.relative_to(root)), reason))
        return None

    for chunk in _chunks(files, BATCH):
        parsed = [(path, d) for path in chunk if (d := parsed_or_listed(path)) is not None]
        try:
            new, existing = await _store(services, [d for _, d in parsed], report.new_ids)
        except (SQLAlchemyError, TakenElsewhere):
            # One file the database refuses would fail the whole batch: store them one by
            # one (parsed again: the failed transaction's objects are not reused).
            new = existing = 0
            for path, _ in parsed:
                decision = parsed_or_listed(path)
                if decision is None:
                    continue
                try:
                    one_new, one_existing = await _store(services, [decision], report.new_ids)
                except TakenElsewhere:
                    reason = "its id is taken by a decision of another workspace"
                    report.failed.append((str(path.relative_to(root)), reason))
                    continue
                except SQLAlchemyError as exc:
                    log.warning("import of %s refused by the database: %s", path, exc)
                    report.failed.append(
                        (
                            str(path.relative_to(root)),
                            f"refused by the database ({type(exc).__name__})",
                        )
                    )
                    continue
                new, existing = new + one_new, existing + one_existing
        report.new += new
        report.existing += existing
        done += len(chunk)
        if progress is not None:
            progress(done, len(files))
    if report.new:
        await services.db.analyze(*IMPORTED_TABLES)
    return report


async def _store(
    services: Services, decisions: list[Decision], new_ids: list[str]
) -> tuple[int, int]:
    """Store the decisions not stored yet, in one transaction; returns (new, already there)
    and adds the new ones' ids to ``new_ids`` once they are committed."""
    new = existing = 0
    added: list[str] = []
    async with services.db.transaction(write=True) as session:
        ids = [d.id for d in decisions]
        known = await repository.stored_ids(session, ids)
        for decision in decisions:
            if known.get(decision.id, decision.workspace) != decision.workspace:
                raise TakenElsewhere(decision.id)
            if decision.id in known:
                existing += 1
                continue
            known[decision.id] = decision.workspace
            repository.add_imported(session, decision)
            # Due at once: this command (or a running server) carries them out.
            services.relay.enqueue(session, decision.id, decision.workspace, leased=False)
            added.append(decision.id)
            new += 1
    new_ids.extend(added)
    return new, existing
