"""The keyword index of decisions: each database's own full-text search, kept by triggers.

What is indexed: a decision's text, its context, its reasons and its tags (the words an agent
wrote), in that column order. The database keeps it in the same transaction as the rows, by
triggers on INSERT into ``decisions``, ``decision_reasons`` and ``decision_tags`` (and on
DELETE from ``decisions``), so every write path is covered (the group writer, the import)
and a keyword search sees a decision the moment its transaction commits. A decision's text,
context, reasons and tags never change after it is recorded (a review writes other columns),
so inserts and deletes are all there is to follow.

- SQLite: an FTS5 table ``decision_search`` (columns ``decision``, ``context``, ``reasons``,
  ``tags``) whose rowid is ``decision_search_keys.id``; that small table maps it to the
  decision's id (an FTS5 rowid must be an integer, and ``decisions`` has none that VACUUM
  keeps). Tokenizer: ``porter unicode61`` (letters and digits make tokens, everything
  else separates them; case and diacritics folded; English words reduced to their stem).
- Postgres: a table ``decision_search`` (``decision_id``, ``document tsvector``) with a GIN
  index; the four parts are weighted A, B, C, D. Text search configuration ``english``
  (stems, and leaves out English stop words). A decision's row is written once, by a
  deferred trigger when its transaction commits, with the reasons and tags inserted after
  it (an update of the row would index the whole document again).

Both were chosen by the retrieval-quality benchmark (docs/QUALITY.md). The DDL lives here
because migrations call it (revision 0008); keep what an existing revision calls stable.

Since revision 0014 the index also holds each decision's workspace (see "workspaces" below:
``add_workspaces``). A migration that rebuilds ``decisions``, ``decision_reasons`` or
``decision_tags`` (SQLite's batch mode copies a table and drops the old one, and its triggers
with it) must call ``install_triggers_v2`` again afterwards (``install_triggers`` before
revision 0014).
"""

from __future__ import annotations

TABLE = "decision_search"
KEYS = "decision_search_keys"  # SQLite only
PG_INDEX = "ix_decision_search_document"
SQLITE_TOKENIZER = "porter unicode61"
PG_CONFIG = "english"
#: FTS5 columns, in order (bm25() takes one weight per column, in this order).
COLUMNS = ("decision", "context", "reasons", "tags")
#: Postgres weight letters of the same parts.
PG_WEIGHTS = {"decision": "A", "context": "B", "reasons": "C", "tags": "D"}


def owned(name: str | None) -> bool:
    """Whether a table or index name belongs to the keyword index (FTS5 adds shadow tables
    named ``decision_search_*``): the models do not describe them, so the drift check and
    autogenerate leave them alone."""
    return name is not None and (name == TABLE or name.startswith(TABLE + "_"))


# ---------------------------------------------------------------- SQLite


def _sqlite_tables(tokenizer: str, columns_of: tuple[str, ...] = COLUMNS) -> list[str]:
    columns = ", ".join(columns_of)
    quoted = "'" + tokenizer.replace("'", "''") + "'"
    return [
        f"CREATE TABLE {KEYS} (id INTEGER PRIMARY KEY, decision_id VARCHAR(8) NOT NULL UNIQUE)",
        f"CREATE VIRTUAL TABLE {TABLE} USING fts5({columns}, tokenize = {quoted})",
    ]


_SQLITE_ROW = f"(SELECT id FROM {KEYS} WHERE decision_id = NEW.decision_id)"


def _sqlite_triggers() -> list[str]:
    return [
        # A new decision: its key, then its row (reasons and tags are inserted after it).
        f"CREATE TRIGGER trg_decisions_search_insert AFTER INSERT ON decisions BEGIN "
        f"INSERT INTO {KEYS} (decision_id) VALUES (NEW.id); "
        f"INSERT INTO {TABLE} (rowid, decision, context, reasons, tags) VALUES "
        f"((SELECT id FROM {KEYS} WHERE decision_id = NEW.id), NEW.decision, "
        f"coalesce(NEW.context, ''), '', ''); END",
        f"CREATE TRIGGER trg_decision_reasons_search AFTER INSERT ON decision_reasons BEGIN "
        f"UPDATE {TABLE} SET reasons = CASE WHEN reasons = '' THEN NEW.text "
        f"ELSE reasons || char(10) || NEW.text END WHERE rowid = {_SQLITE_ROW}; END",
        f"CREATE TRIGGER trg_decision_tags_search AFTER INSERT ON decision_tags BEGIN "
        f"UPDATE {TABLE} SET tags = CASE WHEN tags = '' THEN NEW.tag "
        f"ELSE tags || ' ' || NEW.tag END WHERE rowid = {_SQLITE_ROW}; END",
        # BEFORE: the key must still be there to find the row (and no foreign key action
        # may have removed it first).
        f"CREATE TRIGGER trg_decisions_search_delete BEFORE DELETE ON decisions BEGIN "
        f"DELETE FROM {TABLE} WHERE rowid = (SELECT id FROM {KEYS} WHERE decision_id = OLD.id); "
        f"DELETE FROM {KEYS} WHERE decision_id = OLD.id; END",
    ]


_SQLITE_TRIGGERS = (
    "trg_decisions_search_insert",
    "trg_decision_reasons_search",
    "trg_decision_tags_search",
    "trg_decisions_search_delete",
)


def _sqlite_fill(token: str | None = None) -> list[str]:
    """Index the decisions already stored (reasons and tags in their recorded order); with
    ``token``, the SQL of each row's workspace token too (the workspaces' layout)."""
    column, value = ("", "") if token is None else (", workspace", f", {token}")
    return [
        f"INSERT INTO {KEYS} (decision_id) SELECT id FROM decisions ORDER BY created_at, id",
        f"INSERT INTO {TABLE} (rowid, decision, context, reasons, tags{column}) "
        f"SELECT k.id, d.decision, coalesce(d.context, ''), "
        f"coalesce((SELECT group_concat(text, char(10)) FROM "
        f"(SELECT text FROM decision_reasons r WHERE r.decision_id = d.id "
        f"ORDER BY r.position, r.id)), ''), "
        f"coalesce((SELECT group_concat(tag, ' ') FROM "
        f"(SELECT tag FROM decision_tags t WHERE t.decision_id = d.id "
        f"ORDER BY t.position)), ''){value} "
        f"FROM {KEYS} k JOIN decisions d ON d.id = k.decision_id",
    ]


# ---------------------------------------------------------------- Postgres


def _pg_part(column: str, expression: str, config: str) -> str:
    weight = PG_WEIGHTS[column]
    return f"setweight(to_tsvector('{config}', {expression}), '{weight}')"


def _pg_tables() -> list[str]:
    return [
        f"CREATE TABLE {TABLE} (decision_id VARCHAR(8) NOT NULL, document TSVECTOR NOT NULL, "
        f"CONSTRAINT pk_{TABLE} PRIMARY KEY (decision_id), "
        f"CONSTRAINT fk_{TABLE}_decision_id_decisions FOREIGN KEY (decision_id) "
        f"REFERENCES decisions (id) ON DELETE CASCADE)",
    ]


def _pg_index() -> list[str]:
    # fastupdate off: an insert updates the index itself instead of a pending list, which
    # every search would otherwise read through until a vacuum merged it (and the planner
    # then preferred a full scan).
    return [
        f"CREATE INDEX {PG_INDEX} ON {TABLE} USING GIN (document) WITH (fastupdate = off)",
        f"ANALYZE {TABLE}",
    ]


def _pg_document(row: str, config: str) -> str:
    """The weighted tsvector of decision ``row`` (a row with id, decision and context):
    its text, its context, its reasons and its tags, each part in its recorded order."""
    decision = _pg_part("decision", f"{row}.decision", config)
    context = _pg_part("context", f"coalesce({row}.context, '')", config)
    reasons = _pg_part("reasons", "string_agg(r.text, E'\\n' ORDER BY r.position, r.id)", config)
    tags = _pg_part("tags", "string_agg(t.tag, ' ' ORDER BY t.position)", config)
    return (
        f"{decision} || {context} "
        f"|| coalesce((SELECT {reasons} FROM decision_reasons r "
        f"WHERE r.decision_id = {row}.id), '') "
        f"|| coalesce((SELECT {tags} FROM decision_tags t WHERE t.decision_id = {row}.id), '')"
    )


def _pg_triggers(config: str) -> list[str]:
    """A decision's row is written once, when its transaction commits (a deferred
    constraint trigger): its reasons and tags, inserted after it, are there by then, so no
    row is updated (each update would write the whole document into the index again).
    Reasons or tags added to a decision of an earlier transaction update its row."""
    late_reasons = _pg_part(
        "reasons", "string_agg(n.text, E'\\n' ORDER BY n.position, n.id)", config
    )
    late_tags = _pg_part("tags", "string_agg(n.tag, ' ' ORDER BY n.position)", config)
    indexed = f"EXISTS (SELECT 1 FROM {TABLE} i WHERE i.decision_id = n.decision_id)"
    return [
        f"CREATE FUNCTION cstp_search_decisions() RETURNS trigger LANGUAGE plpgsql AS $$ "
        f"BEGIN INSERT INTO {TABLE} (decision_id, document) "
        f"SELECT d.id, {_pg_document('d', config)} FROM decisions d WHERE d.id = NEW.id "
        f"ON CONFLICT (decision_id) DO NOTHING; RETURN NULL; END $$",
        f"CREATE FUNCTION cstp_search_reasons() RETURNS trigger LANGUAGE plpgsql AS $$ "
        f"BEGIN UPDATE {TABLE} s SET document = s.document || x.part FROM "
        f"(SELECT n.decision_id, {late_reasons} AS part FROM new_rows n WHERE {indexed} "
        f"GROUP BY n.decision_id) x "
        f"WHERE s.decision_id = x.decision_id; RETURN NULL; END $$",
        f"CREATE FUNCTION cstp_search_tags() RETURNS trigger LANGUAGE plpgsql AS $$ "
        f"BEGIN UPDATE {TABLE} s SET document = s.document || x.part FROM "
        f"(SELECT n.decision_id, {late_tags} AS part FROM new_rows n WHERE {indexed} "
        f"GROUP BY n.decision_id) x "
        f"WHERE s.decision_id = x.decision_id; RETURN NULL; END $$",
        "CREATE CONSTRAINT TRIGGER trg_decisions_search AFTER INSERT ON decisions "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
        "EXECUTE FUNCTION cstp_search_decisions()",
        "CREATE TRIGGER trg_decision_reasons_search AFTER INSERT ON decision_reasons "
        "REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT "
        "EXECUTE FUNCTION cstp_search_reasons()",
        "CREATE TRIGGER trg_decision_tags_search AFTER INSERT ON decision_tags "
        "REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT "
        "EXECUTE FUNCTION cstp_search_tags()",
    ]


_PG_TRIGGERS = (
    ("trg_decisions_search", "decisions", "cstp_search_decisions"),
    ("trg_decision_reasons_search", "decision_reasons", "cstp_search_reasons"),
    ("trg_decision_tags_search", "decision_tags", "cstp_search_tags"),
)


def _pg_fill(config: str) -> list[str]:
    return [
        f"INSERT INTO {TABLE} (decision_id, document) "
        f"SELECT d.id, {_pg_document('d', config)} FROM decisions d",
    ]


# ---------------------------------------------------------------- workspaces (revision 0014)
#
# The index holds each decision's workspace as one token no text can make, so that a search
# keeps to its workspace inside the full-text index itself (the index intersects the token's
# postings with the words'), and a word's count is its count in the workspace: another
# workspace's decisions neither fill a search's budget nor push a word out of it.
# SQLite: a fifth FTS5 column ``workspace`` holding ``w<hex of the id>0`` (letters and digits
# only: one token; ending in a digit: no stemming rule touches it). Postgres: the lexeme
# ``cstp-workspace=<id>`` in the document (the parser splits text at ``=``, so no text makes
# it), added with ``array_to_tsvector`` (taken as it is, never parsed).

WORKSPACE_COLUMN = "workspace"
#: FTS5 columns of the workspaces' layout, in order.
COLUMNS_V2 = (*COLUMNS, WORKSPACE_COLUMN)
PG_WORKSPACE_PREFIX = "cstp-workspace="


def sqlite_workspace_token(workspace: str) -> str:
    """The FTS5 token of ``workspace`` (what ``_SQLITE_TOKEN`` computes in SQL)."""
    return "w" + workspace.encode().hex() + "0"


def pg_workspace_query(workspace: str) -> str:
    """The ``tsquery`` text of ``workspace``'s lexeme, quoted (an id holds no quote)."""
    return f"'{PG_WORKSPACE_PREFIX}{workspace}'"


def _sqlite_token(expression: str) -> str:
    # hex() writes upper case; the tokenizer folds it
    return f"('w' || hex({expression}) || '0')"


def _sqlite_triggers_v2() -> list[str]:
    first, *rest = _sqlite_triggers()
    assert first.startswith("CREATE TRIGGER trg_decisions_search_insert")
    insert = (
        f"CREATE TRIGGER trg_decisions_search_insert AFTER INSERT ON decisions BEGIN "
        f"INSERT INTO {KEYS} (decision_id) VALUES (NEW.id); "
        f"INSERT INTO {TABLE} (rowid, decision, context, reasons, tags, workspace) VALUES "
        f"((SELECT id FROM {KEYS} WHERE decision_id = NEW.id), NEW.decision, "
        f"coalesce(NEW.context, ''), '', '', {_sqlite_token('NEW.workspace')}); END"
    )
    return [insert, *rest]


def _pg_lexeme(row: str) -> str:
    return f"array_to_tsvector(ARRAY['{PG_WORKSPACE_PREFIX}' || {row}.workspace])"


def _pg_decisions_function(config: str, *, workspace: bool) -> str:
    document = _pg_document("d", config)
    if workspace:
        document = f"{document} || {_pg_lexeme('d')}"
    return (
        f"CREATE OR REPLACE FUNCTION cstp_search_decisions() RETURNS trigger LANGUAGE plpgsql "
        f"AS $$ BEGIN INSERT INTO {TABLE} (decision_id, document) "
        f"SELECT d.id, {document} FROM decisions d WHERE d.id = NEW.id "
        f"ON CONFLICT (decision_id) DO NOTHING; RETURN NULL; END $$"
    )


def add_workspaces(dialect: str, *, tokenizer: str, config: str) -> list[str]:
    """Revision 0014: the index of the workspaces' layout, from the one of revision 0008."""
    if dialect == "sqlite":
        return [
            *remove("sqlite"),
            *_sqlite_tables(tokenizer, COLUMNS_V2),
            *_sqlite_fill(_sqlite_token("d.workspace")),
            *_sqlite_triggers_v2(),
        ]
    return [
        _pg_decisions_function(config, workspace=True),
        f"UPDATE {TABLE} s SET document = s.document || {_pg_lexeme('d')} "
        f"FROM decisions d WHERE d.id = s.decision_id",
        f"ANALYZE {TABLE}",
    ]


def drop_workspaces(dialect: str, *, tokenizer: str, config: str) -> list[str]:
    """Back to the index of revision 0008 (built again from the rows)."""
    if dialect == "sqlite":
        return [*remove("sqlite"), *install("sqlite", tokenizer=tokenizer, config=config)]
    return [
        _pg_decisions_function(config, workspace=False),
        f"UPDATE {TABLE} s SET document = ts_delete(s.document, "
        f"'{PG_WORKSPACE_PREFIX}' || d.workspace) FROM decisions d WHERE d.id = s.decision_id",
    ]


def install_triggers_v2(dialect: str, *, config: str = PG_CONFIG) -> list[str]:
    """Only the triggers of the workspaces' layout (after a migration rebuilt a table)."""
    if dialect == "sqlite":
        return _sqlite_triggers_v2()
    return [s for s in _pg_triggers(config) if "TRIGGER trg_" in s]


# ---------------------------------------------------------------- what migrations call


def install(
    dialect: str, *, tokenizer: str = SQLITE_TOKENIZER, config: str = PG_CONFIG
) -> list[str]:
    """The statements that create the keyword index, fill it from the rows already stored
    and install the triggers that keep it."""
    if dialect == "sqlite":
        return [*_sqlite_tables(tokenizer), *_sqlite_fill(), *_sqlite_triggers()]
    return [*_pg_tables(), *_pg_fill(config), *_pg_index(), *_pg_triggers(config)]


def install_triggers(dialect: str, *, config: str = PG_CONFIG) -> list[str]:
    """Only the triggers (after a migration rebuilt one of the tables they sit on)."""
    if dialect == "sqlite":
        return _sqlite_triggers()
    return [s for s in _pg_triggers(config) if "TRIGGER trg_" in s]


def remove(dialect: str) -> list[str]:
    """The statements that drop the keyword index, its triggers and its functions."""
    if dialect == "sqlite":
        return [
            *(f"DROP TRIGGER IF EXISTS {name}" for name in _SQLITE_TRIGGERS),
            f"DROP TABLE IF EXISTS {TABLE}",
            f"DROP TABLE IF EXISTS {KEYS}",
        ]
    return [
        *(f"DROP TRIGGER IF EXISTS {name} ON {table}" for name, table, _ in _PG_TRIGGERS),
        *(f"DROP FUNCTION IF EXISTS {function}()" for _, _, function in _PG_TRIGGERS),
        f"DROP TABLE IF EXISTS {TABLE}",
    ]
