"""How well does the ``not_a_decision`` flag separate status updates from decisions?

``python -m bench.quality_flags [--set PATH ...] [--json]``

Runs app/decisions/quality.py's ``flags`` over the hand-written labelled sets (by default
tests/data/quality/labelled.yaml, the set the rules were tuned on, and heldout.yaml, texts
written after the rules were frozen; each entry ``{text, decision, reasons?, context?}``) and
prints, for each set, the
precision and recall of ``not_a_decision`` (the positive class is "not a decision": precision is
the share of flagged texts that really are status updates, recall the share of status updates
that were flagged), the confusion counts, and every misclassified text. Offline, no server.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from app.decisions.quality import NOT_A_DECISION, flags

SETS_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "quality"
DEFAULT_SET = SETS_DIR / "labelled.yaml"
HELD_OUT = SETS_DIR / "heldout.yaml"


@dataclass(frozen=True)
class Example:
    text: str
    decision: bool
    reasons: int = 0
    context: str | None = None


@dataclass
class Score:
    tp: int = 0  # flagged, and not a decision
    fp: int = 0  # flagged, but a decision
    fn: int = 0  # not flagged, but not a decision
    tn: int = 0  # not flagged, and a decision
    false_positives: list[Example] = field(default_factory=list)
    false_negatives: list[Example] = field(default_factory=list)

    @property
    def precision(self) -> float:
        flagged = self.tp + self.fp
        return self.tp / flagged if flagged else 1.0

    @property
    def recall(self) -> float:
        noise = self.tp + self.fn
        return self.tp / noise if noise else 1.0


def load(path: Path = DEFAULT_SET) -> list[Example]:
    rows: list[dict[str, Any]] = yaml.safe_load(path.read_text(encoding="utf-8"))
    examples = []
    for row in rows:
        if not isinstance(row.get("text"), str) or not isinstance(row.get("decision"), bool):
            raise ValueError(f"{path}: each entry needs a text and decision: true|false: {row}")
        examples.append(
            Example(row["text"], row["decision"], int(row.get("reasons", 0)), row.get("context"))
        )
    return examples


def score(examples: list[Example]) -> Score:
    result = Score()
    for ex in examples:
        flagged = NOT_A_DECISION in flags(ex.text, reasons=ex.reasons, context=ex.context)
        if flagged and not ex.decision:
            result.tp += 1
        elif flagged:
            result.fp += 1
            result.false_positives.append(ex)
        elif not ex.decision:
            result.fn += 1
            result.false_negatives.append(ex)
        else:
            result.tn += 1
    return result


def _describe(ex: Example) -> str:
    extra = f" (reasons: {ex.reasons})" if ex.reasons else ""
    extra += f" (context: {ex.context!r})" if ex.context else ""
    return f"  {ex.text!r}{extra}"


def summary(path: Path, examples: list[Example], s: Score) -> dict[str, Any]:
    return {
        "set": str(path),
        "texts": len(examples),
        "decisions": sum(e.decision for e in examples),
        "notDecisions": sum(not e.decision for e in examples),
        "precision": round(s.precision, 4),
        "recall": round(s.recall, 4),
        "confusion": {"tp": s.tp, "fp": s.fp, "fn": s.fn, "tn": s.tn},
        "falsePositives": [e.text for e in s.false_positives],
        "falseNegatives": [e.text for e in s.false_negatives],
    }


def report(path: Path, examples: list[Example], s: Score) -> None:
    noise = sum(not e.decision for e in examples)
    print(
        f"{path.name}: {len(examples)} texts, "
        f"{len(examples) - noise} decisions, {noise} not decisions"
    )
    print(f"precision {s.precision:.3f}   recall {s.recall:.3f}")
    print("                     flagged  not flagged")
    print(f"  not a decision     {s.tp:7d}  {s.fn:11d}")
    print(f"  decision           {s.fp:7d}  {s.tn:11d}")
    print(f"decisions wrongly flagged (false positives): {s.fp}")
    for ex in s.false_positives:
        print(_describe(ex))
    print(f"status updates not flagged (false negatives): {s.fn}")
    for ex in s.false_negatives:
        print(_describe(ex))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.quality_flags", description=__doc__)
    parser.add_argument(
        "--set",
        type=Path,
        action="append",
        dest="sets",
        help="a labelled YAML set (repeatable; default: labelled.yaml and heldout.yaml)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    sets: list[Path] = args.sets or [DEFAULT_SET, HELD_OUT]
    results = [(path, load(path)) for path in sets]
    scored = [(path, examples, score(examples)) for path, examples in results]
    if args.json:
        print(json.dumps([summary(*item) for item in scored], indent=2))
        return 0
    print("positive class: not_a_decision (a status update, acknowledgement or report)")
    for item in scored:
        print()
        report(*item)
    return 0


if __name__ == "__main__":
    sys.exit(main())
