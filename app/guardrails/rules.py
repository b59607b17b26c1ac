"""Guardrail rules and rule sets: what a rule is, the content a rule set is stored as (and
rebuilt from, for ``cstp guardrails replay``), and its version. Rule files are read and
validated by app.guardrails.rule_files."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeAlias

Action: TypeAlias = Literal["block", "warn", "escalate"]
Mode: TypeAlias = Literal["enforce", "shadow"]
Scalar: TypeAlias = str | int | float | bool

ACTIONS: tuple[str, ...] = ("block", "warn", "escalate")
MODES: tuple[str, ...] = ("enforce", "shadow")
OPERATORS: tuple[str, ...] = ("==", "!=", "<", "<=", ">", ">=", "in", "not in")
LIST_OPERATORS = frozenset({"in", "not in"})
ORDER_OPERATORS = frozenset({"<", "<=", ">", ">="})
ID_PATTERN = re.compile(r"[a-z0-9-]+")

_REQUIRED_KEYS = ("id", "description", "action", "message")
_RULE_KEYS = (
    *_REQUIRED_KEYS,
    "mode",
    "scope",
    "conditions",
    "requirements",
    "suggestion",
    "timeout",
)
DEFAULT_TIMEOUT = 3600
"""How long an escalate rule's approval waits for a person, in seconds, when its rule says
nothing (SPEC.md, section 8: ``1h``)."""
_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
TIMEOUT_PATTERN = re.compile(r"([1-9][0-9]{0,6})([smhd])")
MAX_TIMEOUT = 365 * 86400
"""The longest an approval may wait: a year (a longer one is a typo, or no deadline)."""
CONTENT_FORMAT = 1
"""The format of a rule set's stored content (``RuleSet.content``)."""
_CONDITION_KEYS = ("field", "operator", "op", "value")


class RuleFileError(ValueError):
    """A rule file cannot be used; ``str()`` reads ``<file>:<line>: <problem>``."""

    def __init__(self, path: Path | str, line: int | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.message = message
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class Condition:
    """One ``{field, operator, value}`` test of a fact; list operators hold a tuple value."""

    field: str
    op: str
    value: Scalar | tuple[Scalar, ...]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (tuples become lists), as shown by ``cstp.listGuardrails``:
        ``operator`` as clients of the earlier CSTP server read it; ``op`` is the same value,
        kept for this server's own early clients (deprecated, docs/PROTOCOL.md)."""
        value = list(self.value) if isinstance(self.value, tuple) else self.value
        return {"field": self.field, "operator": self.op, "value": value, "op": self.op}


@dataclass(frozen=True)
class Rule:
    """A validated guardrail; ``source`` is for operators' logs, never for API clients.

    ``mode`` ``shadow``: the rule is evaluated and its result stored (would_block /
    would_warn / would_escalate), but it never takes part in the verdict or the answer.
    ``timeout`` (seconds) is an escalate rule's: how long its approval waits for a person;
    None for the other actions."""

    id: str
    description: str
    action: Action
    scope: tuple[str, ...]
    conditions: tuple[Condition, ...]
    requirements: tuple[Condition, ...]
    message: str
    suggestion: str | None
    source: str = ""
    mode: Mode = "enforce"
    timeout: int | None = None

    def applies_to(self, scope: str | None) -> bool:
        """Unscoped rules apply everywhere; scoped ones only to the listed projects."""
        return not self.scope or (scope is not None and scope in self.scope)

    def as_dict(self) -> dict[str, Any]:
        """The public description of the rule (the ``cstp.listGuardrails`` item shape)."""
        out: dict[str, Any] = {
            "id": self.id,
            "description": self.description,
            "action": self.action,
            "mode": self.mode,
            "scope": list(self.scope),
            "conditions": [c.as_dict() for c in self.conditions],
            "requirements": [c.as_dict() for c in self.requirements],
        }
        if self.timeout is not None:  # an escalate rule's only: the others' dicts are as before
            out["timeout"] = timeout_text(self.timeout)
        return out if self.suggestion is None else {**out, "suggestion": self.suggestion}

    def content(self) -> dict[str, Any]:
        """Everything that decides what the rule does and says, for ``RuleSet.content`` (an
        escalate rule's ``timeout`` too: the content of a rule set without one is as before,
        and so is its hash)."""
        out = {
            "id": self.id,
            "description": self.description,
            "action": self.action,
            "mode": self.mode,
            "scope": list(self.scope),
            "conditions": [_condition_content(c) for c in self.conditions],
            "requirements": [_condition_content(c) for c in self.requirements],
            "message": self.message,
            "suggestion": self.suggestion,
        }
        return out if self.timeout is None else {**out, "timeout": self.timeout}


def timeout_text(seconds: int) -> str:
    """A timeout as a rule file would write it, in its largest whole unit (``90m``, ``2h``)."""
    for unit, size in _UNITS.items():
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"  # unreachable: every whole number of seconds divides by 1


def parse_timeout(text: str) -> int | None:
    """``<n>s``, ``<n>m``, ``<n>h`` or ``<n>d`` as seconds, at most ``MAX_TIMEOUT``; None
    when it is none of those."""
    match = TIMEOUT_PATTERN.fullmatch(text)
    if match is None:
        return None
    seconds = int(match.group(1)) * _UNITS[match.group(2)]
    return seconds if seconds <= MAX_TIMEOUT else None


def _condition_content(condition: Condition) -> dict[str, Any]:
    value = list(condition.value) if isinstance(condition.value, tuple) else condition.value
    return {"field": condition.field, "op": condition.op, "value": value}


@dataclass(frozen=True)
class RuleSet:
    """All loaded rules in load order, plus a content hash so audits can name the set in force."""

    rules: tuple[Rule, ...]
    version: str

    def applicable(self, scope: str | None) -> tuple[Rule, ...]:
        """The rules that apply to a request for project ``scope`` (None = no project)."""
        return tuple(rule for rule in self.rules if rule.applies_to(scope))

    @functools.cached_property
    def content(self) -> str:
        """The whole rule set, in load order, as compact sorted-key JSON: what is stored in
        ``guardrail_rule_sets`` and read back by ``cstp guardrails replay``."""
        payload = {"format": CONTENT_FORMAT, "rules": [rule.content() for rule in self.rules]}
        return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    @functools.cached_property
    def hash(self) -> str:
        """SHA-256 (hex) of ``content``: the key evaluations record (``rule_set_hash``)."""
        return hashlib.sha256(self.content.encode("utf-8")).hexdigest()


def rule_set_from_content(content: str, source: str = "stored rule set") -> RuleSet:
    """A rule set rebuilt from its stored ``content``. Raises ValueError when the text is not
    a rule set's content (an edited row, or a format this version does not know)."""
    try:
        payload = json.loads(content)
        if payload["format"] != CONTENT_FORMAT:
            raise ValueError(f"unknown rule set format {payload['format']!r}")
        rules = tuple(_rule_from_content(item, source) for item in payload["rules"])
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a rule set's content ({type(exc).__name__}: {exc})") from None
    return RuleSet(rules=rules, version=rule_set_version(rules))


def _rule_from_content(item: dict[str, Any], source: str) -> Rule:
    def conditions(key: str) -> tuple[Condition, ...]:
        return tuple(
            Condition(
                field=c["field"],
                op=c["op"],
                value=tuple(c["value"]) if isinstance(c["value"], list) else c["value"],
            )
            for c in item[key]
        )

    if item["action"] not in ACTIONS or item["mode"] not in MODES:
        raise ValueError(f"rule {item['id']!r}: unknown action or mode")
    return Rule(
        id=item["id"],
        description=item["description"],
        action=item["action"],
        scope=tuple(item["scope"]),
        conditions=conditions("conditions"),
        requirements=conditions("requirements"),
        message=item["message"],
        suggestion=item["suggestion"],
        source=source,
        mode=item["mode"],
        timeout=item.get("timeout"),
    )


def rule_set_version(rules: Sequence[Rule]) -> str:
    """Hash of the rules' content only (not paths, order of files, or mtimes). A rule's mode
    counts only when it is ``shadow``, so the versions of rule sets without shadow rules are
    what they were before modes existed."""
    payload = [
        {**_versioned(r.as_dict()), "message": r.message} for r in sorted(rules, key=lambda r: r.id)
    ]
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def _versioned(described: dict[str, Any]) -> dict[str, Any]:
    if described.get("mode") == "enforce":
        return {k: v for k, v in described.items() if k != "mode"}
    return described
