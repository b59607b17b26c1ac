"""Loading and strict validation of guardrail rule files.

Rules are operator-written YAML, so every mistake is reported as a ``RuleFileError`` naming the
file and line: a typo must stop the server at start-up rather than silently disable a guardrail.
Parsing walks the composed node tree (``yaml.compose`` with the safe loader) so line numbers
are exact, and only SafeLoader constructors ever run on the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .rules import (
    _CONDITION_KEYS,
    _REQUIRED_KEYS,
    _RULE_KEYS,
    ACTIONS,
    DEFAULT_TIMEOUT,
    ID_PATTERN,
    LIST_OPERATORS,
    MODES,
    OPERATORS,
    ORDER_OPERATORS,
    Condition,
    Rule,
    RuleFileError,
    RuleSet,
    Scalar,
    parse_timeout,
    rule_set_version,
)

SHIPPED_RULES_DIR: Path = Path(__file__).resolve().parent / "rules"


def rule_dirs(extra_dir: Path | str | None) -> list[Path]:
    """Shipped rules first, then the operator's ``CSTP_GUARDRAILS_DIR`` when set."""
    return [SHIPPED_RULES_DIR] + ([Path(extra_dir)] if extra_dir else [])


def load_rules(dirs: Sequence[Path | str]) -> RuleSet:
    """Load every ``*.yaml``/``*.yml`` file of each dir (sorted); ids must be unique overall."""
    rules: list[Rule] = []
    seen: dict[str, str] = {}
    for directory in map(Path, dirs):
        if not directory.is_dir():
            raise RuleFileError(directory, None, "not a readable guardrails directory")
        files = sorted(
            p
            for p in directory.iterdir()
            if p.suffix in (".yaml", ".yml") and not p.name.startswith(".") and p.is_file()
        )
        for path in files:
            for rule, line in _load_file(path):
                if rule.id in seen:
                    raise RuleFileError(
                        path,
                        line,
                        f"duplicate guardrail id '{rule.id}' (first defined at {seen[rule.id]})",
                    )
                seen[rule.id] = f"{path}:{line}"
                rules.append(rule)
    return RuleSet(rules=tuple(rules), version=rule_set_version(rules))


class _FileParser:
    """Turns one file's node tree into rules, raising with the offending node's line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.constructor = SafeConstructor()

    def fail(self, node: Node, message: str) -> RuleFileError:
        return RuleFileError(self.path, node.start_mark.line + 1, message)

    def keys(
        self, node: Node, what: str, allowed: Sequence[str], required: Sequence[str]
    ) -> dict[str, Node]:
        """A mapping with only ``allowed`` and all ``required`` keys, as key -> value node."""
        if not isinstance(node, MappingNode):
            raise self.fail(node, f"{what} must be a mapping")
        out: dict[str, Node] = {}
        for key, value in node.value:
            if not isinstance(key, ScalarNode) or key.tag != "tag:yaml.org,2002:str":
                raise self.fail(key, f"keys of {what} must be strings")
            if key.value not in allowed:
                raise self.fail(
                    key,
                    f"unknown key '{key.value}' in {what} (expected one of {', '.join(allowed)})",
                )
            if key.value in out:
                raise self.fail(key, f"duplicate key '{key.value}' in {what}")
            out[key.value] = value
        for name in required:
            if name not in out:
                raise self.fail(node, f"{what} is missing required key '{name}'")
        return out

    def scalar(self, node: Node, what: str) -> Scalar:
        if isinstance(node, ScalarNode):
            try:
                value = self.constructor.construct_object(node, deep=True)
            except yaml.YAMLError as exc:
                problem = getattr(exc, "problem", None) or str(exc)
                raise self.fail(node, f"invalid {what}: {problem}") from None
            if isinstance(value, (str, int, float, bool)):
                return value
        raise self.fail(node, f"{what} must be a string, number or boolean")

    def text(self, node: Node, what: str) -> str:
        value = self.scalar(node, what) if isinstance(node, ScalarNode) else None
        if not isinstance(value, str) or not value.strip():
            raise self.fail(node, f"{what} must be a non-empty string")
        return value

    def sequence(self, node: Node | None, what: str) -> list[Node]:
        """A list node's items; an absent or null key counts as an empty list."""
        if node is None or _is_null(node):
            return []
        if not isinstance(node, SequenceNode):
            raise self.fail(node, f"{what} must be a list")
        return list(node.value)

    def rules(self, root: Node | None) -> list[tuple[Rule, int]]:
        """Each rule of the file with the line of its id (for duplicate-id reports)."""
        if root is None:
            raise RuleFileError(self.path, 1, "file is empty (expected a 'guardrails' list)")
        top = self.keys(root, "the top level", ("guardrails",), ("guardrails",))
        if not isinstance(top["guardrails"], SequenceNode):
            raise self.fail(top["guardrails"], "'guardrails' must be a list")
        return [self.rule(item) for item in top["guardrails"].value]

    def rule(self, node: Node) -> tuple[Rule, int]:
        keys = self.keys(node, "rule", _RULE_KEYS, _REQUIRED_KEYS)
        rule_id = self.text(keys["id"], "id")
        if not ID_PATTERN.fullmatch(rule_id):
            raise self.fail(keys["id"], f"invalid id '{rule_id}' (use only a-z, 0-9 and '-')")
        action = self.scalar(keys["action"], "action")
        if action not in ACTIONS:
            raise self.fail(
                keys["action"], f"unknown action '{action}' (expected block, warn or escalate)"
            )
        suggestion = keys.get("suggestion")
        mode = self.scalar(keys["mode"], "mode") if "mode" in keys else "enforce"
        if mode not in MODES:
            raise self.fail(keys["mode"], f"unknown mode '{mode}' (expected enforce or shadow)")
        rule = Rule(
            id=rule_id,
            description=self.text(keys["description"], "description"),
            action="block" if action == "block" else "escalate" if action == "escalate" else "warn",
            scope=tuple(
                self.text(n, "scope entry") for n in self.sequence(keys.get("scope"), "scope")
            ),
            conditions=self.conditions(keys.get("conditions"), "conditions"),
            requirements=self.conditions(keys.get("requirements"), "requirements"),
            message=self.text(keys["message"], "message"),
            suggestion=None
            if suggestion is None or _is_null(suggestion)
            else self.text(suggestion, "suggestion"),
            source=str(self.path),
            mode="shadow" if mode == "shadow" else "enforce",
            timeout=self.timeout(keys.get("timeout"), action),
        )
        return rule, keys["id"].start_mark.line + 1

    def timeout(self, node: Node | None, action: Scalar) -> int | None:
        """An escalate rule's timeout in seconds (default one hour); no other rule has one."""
        if action != "escalate":
            if node is not None:
                raise self.fail(node, "only an escalate rule has a timeout")
            return None
        if node is None:
            return DEFAULT_TIMEOUT
        value = self.scalar(node, "timeout")
        seconds = parse_timeout(value) if isinstance(value, str) else None
        if seconds is None:
            raise self.fail(
                node,
                f"invalid timeout '{value}' (expected <n>s, <n>m, <n>h or <n>d up to 365d, "
                "e.g. 30m)",
            )
        return seconds

    def conditions(self, node: Node | None, what: str) -> tuple[Condition, ...]:
        return tuple(self.condition(item) for item in self.sequence(node, what))

    def condition(self, node: Node) -> Condition:
        keys = self.keys(node, "condition", _CONDITION_KEYS, ("field", "value"))
        field = self.text(keys["field"], "field")
        # A file may spell the key ``operator`` (as listGuardrails shows it) or ``op``.
        if ("operator" in keys) == ("op" in keys):
            raise self.fail(node, "condition needs exactly one of 'operator' or 'op'")
        op_node = keys.get("operator") or keys["op"]
        op = self.scalar(op_node, "operator")
        if not isinstance(op, str) or op not in OPERATORS:
            raise self.fail(
                op_node, f"unknown operator '{op}' (expected one of {', '.join(OPERATORS)})"
            )
        value_node = keys["value"]
        if op in LIST_OPERATORS:
            if not isinstance(value_node, SequenceNode):
                raise self.fail(value_node, f"operator '{op}' needs a list value")
            items = tuple(self.scalar(item, "list item") for item in value_node.value)
            return Condition(field=field, op=op, value=items)
        if isinstance(value_node, SequenceNode):
            raise self.fail(value_node, f"operator '{op}' needs a single value, not a list")
        value = self.scalar(value_node, "value")
        if op in ORDER_OPERATORS and isinstance(value, bool):
            raise self.fail(value_node, f"operator '{op}' needs a number or string value")
        return Condition(field=field, op=op, value=value)


def _is_null(node: Node) -> bool:
    """``key:`` or ``key: null`` - treated as absent, as the API treats null params."""
    return isinstance(node, ScalarNode) and node.tag == "tag:yaml.org,2002:null"


# libyaml's safe loader where PyYAML was built with it (the wheels are): the same nodes and
# marks, ten times faster than the pure-Python one (every server start and command loads
# the rules).
_COMPOSER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_file(path: Path) -> list[tuple[Rule, int]]:
    """Parse one file; only SafeLoader composition runs, so no YAML tag can execute code."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleFileError(path, None, f"cannot read rule file: {exc}") from None
    try:
        root = yaml.compose(text, Loader=_COMPOSER)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "syntax error"
        raise RuleFileError(
            path, mark.line + 1 if mark else None, f"YAML syntax error: {problem}"
        ) from None
    except yaml.YAMLError as exc:
        raise RuleFileError(path, None, f"YAML syntax error: {exc}") from None
    return _FileParser(path).rules(root)
