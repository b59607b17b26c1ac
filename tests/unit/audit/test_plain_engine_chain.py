"""The audit chain on a SQLite engine that is not the server's (a script's own ``create_engine``):
each commit reads the head and links after it, so two such engines on one file take turns on
one chain."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

from app.audit.canonical import Covered
from app.audit.chain import CHAIN, GENESIS, append, entry_hash, use_key
from app.db import models as _all_models  # noqa: F401 - every table known
from app.db.base import Base


def _engine(path: Path) -> Engine:
    engine = create_engine(f"sqlite:///{path}")
    use_key(engine, b"k" * 32)
    return engine


def _commit(engine: Engine, *row_ids: str) -> None:
    with Session(engine) as session, session.begin():
        append(session, *(Covered("intents", r, r[-1] * 64) for r in row_ids))


def test_two_plain_engines_take_turns_on_one_chain(tmp_path: Path) -> None:
    path = tmp_path / "chain.db"
    first, second = _engine(path), _engine(path)
    Base.metadata.create_all(first, tables=[CHAIN])
    try:
        _commit(first, "row-1")
        _commit(second, "row-2", "row-3")
        _commit(first, "row-4")  # its engine's last append is no longer the head
        with first.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT seq, table_name, row_id, digest, prev_hash, hash, keyed FROM "
                    f"{CHAIN.name} ORDER BY seq"
                )
            ).all()
    finally:
        first.dispose()
        second.dispose()
    assert [(r.seq, r.row_id) for r in rows] == [
        (1, "row-1"),
        (2, "row-2"),
        (3, "row-3"),
        (4, "row-4"),
    ]
    prev = GENESIS
    for r in rows:
        assert r.prev_hash == prev
        assert r.keyed
        assert r.hash == entry_hash(b"k" * 32, r.seq, r.table_name, r.row_id, r.digest, prev)
        prev = r.hash
