"""``cstp mcp``: MCP on stdin/stdout, forwarding every tool call to a running server.
Registered on ``cstp`` by app.cli."""

from __future__ import annotations

import click

from .failures import Failure


@click.command("mcp")
@click.option(
    "--url",
    envvar="CSTP_URL",
    show_envvar=True,
    default="http://127.0.0.1:9991",
    help="The running CSTP server to forward to.",
)
@click.option(
    "--token",
    envvar="CSTP_TOKEN",
    show_envvar=True,
    default=None,
    help="A bearer token of that server: every call is this token's agent's.",
)
def mcp_command(url: str, token: str | None) -> None:
    """Speak MCP on stdin/stdout (for clients that spawn a command), forwarding every tool
    call to a running server. Nothing but the protocol is written to stdout."""
    from ..mcp import stdio
    from .client.transport import Caller, ClientError, endpoint

    token = (token or "").strip()
    if not token:
        raise Failure("no token: set CSTP_TOKEN to a token the server knows")
    target = endpoint(url)
    try:
        Caller(url, token, as_json=True).call("rpc.discover", {})
    except ClientError as exc:
        if "refused the token" in exc.message:
            raise
        # The server may start after its client: calls fail (-32006) until it answers.
        click.echo(f"warning: {exc.message}; tool calls fail until it answers", err=True)
    stdio.run(target, token)
