"""``cstp audit`` (checkpoints of the audit chain's head, and its verification) and
``cstp guardrails replay``: the auditor's commands (docs/AUDIT.md), read-only, each in one
snapshot of the configured database. Registered on ``cstp`` by app.cli."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from .client.render import echo, echo_lines
from .failures import Failure
from .runner import load_settings, read_snapshot


class _CannotReplay(click.ClickException):
    """Nothing to compare (an unknown evaluation, a rule set not stored): exit code 2, so a
    script tells it from a verdict that differs (1)."""

    exit_code = 2


@click.group()
def audit() -> None:
    """The audit chain: checkpoints of its head, and verification (docs/AUDIT.md)."""


@audit.command("checkpoint")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the checkpoint to FILE (kept outside the database) instead of printing it.",
)
def audit_checkpoint(out: Path | None) -> None:
    """The chain's head now: sequence, hash, time and a MAC over them (an HMAC under
    CSTP_AUDIT_KEY, a plain SHA-256 without a key). Verify against it later with
    `cstp audit verify --checkpoint FILE`: a chain cut below it is then caught."""
    from ..audit.checkpoints import take_checkpoint
    from ..runtime import utc_now

    key = load_settings().audit_key
    point = read_snapshot(lambda conn: take_checkpoint(conn, key, utc_now()))
    if out is None:
        click.echo(point.as_json())
        return
    out.write_text(point.as_json() + "\n", encoding="utf-8")
    click.echo(f"checkpoint of seq {point.seq} written to {out}", err=True)


@audit.command("verify")
@click.option(
    "--checkpoint",
    "checkpoint_files",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A checkpoint taken earlier (repeatable): the chain must still hold its entry.",
)
@click.option(
    "--from",
    "start",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Check entries from this sequence number on (links from the entry before it).",
)
def audit_verify(checkpoint_files: tuple[Path, ...], start: int) -> None:
    """Recompute every entry's digest and link, and check that every audited row has an
    entry. Prints each problem with its sequence number, table and row id; exits 0 only
    when everything holds."""
    from ..audit.checkpoints import read_checkpoint
    from ..audit.verify import verify

    key = load_settings().audit_key
    points = []
    for path in checkpoint_files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
            raise Failure(f"{path}: cannot read the checkpoint ({why})") from None
        try:
            points.append(read_checkpoint(text, str(path)))
        except ValueError as exc:
            raise Failure(str(exc)) from None

    def work(conn: Any) -> Any:
        with click.progressbar(length=0, label="verifying", file=sys.stderr) as bar:

            def progress(done: int, total: int) -> None:
                bar.length = total
                bar.update(done - bar.pos)

            return verify(conn, key, start=start, checkpoints=points, progress=progress)

    report = read_snapshot(work)
    for problem in report.problems:
        echo(problem.line())  # it names stored rows: no control character raw
    keyed = "HMAC-SHA256" if key is not None else "SHA-256, no key"
    span = f"entries {report.first}..{report.last}" if report.last >= report.first else "no entries"
    verdict = "ok" if report.ok else f"{len(report.problems)} problem(s)"
    click.echo(f"{span} checked ({keyed}), {len(points)} checkpoint(s): {verdict}")
    if not report.ok:
        sys.exit(1)


def _escalations(count: int) -> str:
    return f", escalations {count}" if count else ""


@click.command("replay")
@click.argument("evaluation_id")
def guardrails_replay(evaluation_id: str) -> None:
    """Evaluate a stored guardrail evaluation again with the rule set it used, and say
    whether the verdict is the same (exit 0), different (1), or cannot be replayed (2)."""
    from ..approvals.service import status_of
    from ..guardrails.replay import CannotReplay, replay, verdict_word
    from ..runtime import iso

    def work(conn: Any) -> Any:
        try:
            return replay(conn, evaluation_id)
        except CannotReplay as exc:
            raise _CannotReplay(str(exc)) from None

    result = read_snapshot(work)
    ev, rules = result.evaluation, result.rule_set
    evaluated, violations, warnings = result.counts
    echo_lines(  # stored text (agent, rule names): no control character raw
        f"evaluation {ev['id']} ({ev['source']}, agent {ev['agent']}, "
        f"{iso(ev['evaluated_at'])})\n"
        f"rule set {ev['rule_set_hash']} (version {rules.version}, {len(rules.rules)} rules)\n"
        f"stored:   allowed {str(bool(ev['allowed'])).lower()} "
        f"({verdict_word(ev['violations'], ev.get('escalations'))}), evaluated {ev['evaluated']}, "
        f"violations {ev['violations']}, warnings {ev['warnings']}"
        f"{_escalations(ev.get('escalations') or 0)}\n"
        f"replayed: allowed {str(result.allowed).lower()} "
        f"({verdict_word(violations, result.escalations)}), evaluated {evaluated}, "
        f"violations {violations}, warnings {warnings}{_escalations(result.escalations)}"
    )
    approval = result.approval
    if approval is not None:
        status = status_of(approval.verdict, approval.expires_at, datetime.now(UTC))
        how = f"approval {approval.id}: {status}"
        if approval.decided_by is not None:
            how += f" by {approval.decided_by} at {iso(approval.decided_at)}"
        elif status == "expired":
            how += f" at {iso(approval.expires_at)}"
        else:
            how += f" (expires {iso(approval.expires_at)})"
        echo_lines(how + (f": {approval.reason}" if approval.reason else ""))
    for difference in result.differences:
        echo(f"  differs: {difference}")
    click.echo("same verdict" if result.same else "DIFFERENT verdict")
    if not result.same:
        sys.exit(1)
