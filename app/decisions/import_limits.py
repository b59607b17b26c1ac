"""What ``cstp import`` holds a whole decision file to, and the error that refuses one.

A file is a regular file (a symbolic link is not followed; a named pipe, socket or device is
never opened) no larger than the API's body cap; its YAML holds no aliases; and the decision
read from it is within the limits the API holds a client to, checked by the API's own params
structs. Each value's own checks (type, length, range) are in app.decisions.import_values; the
mapping of the file's keys to a ``Decision`` is in app.decisions.import_file.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from app.db.decisions import Decision
from app.errors import CstpError
from app.operations.params import decode

from .schemas import RecordDecisionParams, ReviewDecisionParams

# libyaml's safe loader when PyYAML has it (its wheels do): the same documents, faster.
SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class Unreadable(Exception):
    """This file cannot be imported; the message says why (shown to the operator)."""


_KINDS = (
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
    (stat.S_ISDIR, "a directory"),
)


def _not_regular(mode: int) -> Unreadable:
    if stat.S_ISLNK(mode):
        return Unreadable("a symbolic link: not followed")
    kind = next((name for test, name in _KINDS if test(mode)), "not a file")
    return Unreadable(f"{kind}, not a regular file: not read")


def read_capped(path: Path, max_bytes: int) -> bytes:
    """The file's bytes, if it is a regular file (a symbolic link is not followed) of at most
    ``max_bytes`` (the API's body cap: a file holds no more than a request could).

    Anything else is refused before it is opened: opening a named pipe blocks until a writer
    comes, which would hang the import forever, and opening a device can have effects of its
    own. The open itself is non-blocking too, for an entry swapped for a pipe after the
    check; the descriptor is checked again before anything is read."""
    mode = os.lstat(path).st_mode
    if not stat.S_ISREG(mode):
        raise _not_regular(mode)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link (swapped in after the check)
            raise Unreadable("a symbolic link: not followed") from None
        raise
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(handle.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(mode)
        content = handle.read(max_bytes + 1)
    if len(content) > max_bytes:
        raise Unreadable(f"larger than {max_bytes} bytes (CSTP_MAX_BODY_BYTES)")
    return content


def refuse_aliases(content: bytes) -> None:
    """Refuse YAML aliases (``*name``): each one repeats a whole node, so a kilobyte of nested
    aliases ("billion laughs") expands to gigabytes. Our own export never writes one."""
    try:
        for event in yaml.parse(content, Loader=SAFE_LOADER):
            if isinstance(event, yaml.AliasEvent):
                mark = event.start_mark  # the parser always sets it
                line = f" (line {mark.line + 1})" if mark is not None else ""
                raise Unreadable(f"YAML aliases are not accepted{line}")
    except yaml.YAMLError:
        return  # safe_load reports the syntax error, with its line


def within_api_limits(d: Decision) -> None:
    """Every field within the limits the API holds a client to (lengths, counts, the
    free-form limits of ``affected_kpis``): checked by the API's own params structs, so an
    import can store nothing a client could not have sent."""
    recorded = {
        "decision": d.decision,
        "confidence": d.confidence,
        "category": d.category,
        "stakes": d.stakes,
        "context": d.context,
        "mentalState": d.mental_state,
        "reasons": [{"type": r.type, "text": r.text, "strength": r.strength} for r in d.reasons],
        "kpiIndicators": d.kpi_indicators or [],
        "tags": [t.tag for t in d.tags],
        "project": d.project,
        "feature": d.feature,
        "pr": d.pr,
        "file": d.file,
        "line": d.line,
        "commit": d.commit,
        "correlationId": d.correlation_id,
    }
    checks: list[tuple[dict[str, Any], type[Any]]] = [(recorded, RecordDecisionParams)]
    if d.outcome is not None:
        checks.append(
            (
                {
                    "id": d.id,
                    "outcome": d.outcome,
                    "actualResult": d.actual_result,
                    "lessons": d.lessons,
                    "notes": d.review_notes,
                    "affectedKpis": d.affected_kpis,
                },
                ReviewDecisionParams,
            )
        )
    for params, struct in checks:
        try:
            decode(params, struct)
        except CstpError as exc:
            field, problem = exc.data["field"], exc.data["error"]
            raise Unreadable(f"{_yaml_key(field)}: {problem}") from None


def _yaml_key(field: str) -> str:
    """The file's spelling of an API field path: ``kpiIndicators[2]`` -> ``kpi_indicators[2]``
    (``notes`` is ``review_notes`` in the file)."""
    head, dot, rest = field.partition(".")
    name = re.sub(r"(?<=[a-z])([A-Z])", lambda m: "_" + m.group(1).lower(), head)
    return ("review_notes" if name == "notes" else name) + dot + rest
