"""The client subcommands, in the order ``cstp --help`` has always listed them."""

from __future__ import annotations

import click

from .approvals import approvals
from .decisions import get_cmd, list_cmd, query_cmd, record_cmd, review_cmd
from .guidance import announce_cmd, calibration_cmd, check_cmd, guardrails_cmd
from .learning import drift_cmd, ready_cmd

COMMANDS = (
    query_cmd,
    check_cmd,
    announce_cmd,
    record_cmd,
    review_cmd,
    get_cmd,
    list_cmd,
    calibration_cmd,
    guardrails_cmd,
    approvals,
    ready_cmd,
    drift_cmd,
)


def register_client_commands(group: click.Group) -> None:
    """Add the client subcommands to the ``cstp`` group."""
    for command in COMMANDS:
        group.add_command(command)
