"""``cstp serve``: apply pending migrations, check what the server process would refuse, then
start the server (uvicorn). Registered on ``cstp`` by app.cli."""

from __future__ import annotations

import logging
import sys

import click

from ..config import ConfigError, Settings
from .failures import Failure, redact
from .runner import debugging, load_settings, run
from .schema import ensure_schema


def _setup_logging(level: str) -> None:
    """The server's logging (replacing the one-line logging of the other commands)."""
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
        force=True,
    )
    if level != "DEBUG":  # one line per Alembic plugin at every start says nothing to an operator
        logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)


@click.command()
@click.option("--host", default=None, help="Bind address (default CSTP_HOST or 127.0.0.1).")
@click.option(
    "--port",
    default=None,
    type=click.IntRange(1, 65535),
    help="Port (default CSTP_PORT or 9991).",
)
@click.option(
    "--workers", default=1, type=click.IntRange(min=1), show_default=True, help="Server processes."
)
def serve(host: str | None, port: int | None, workers: int) -> None:
    """Apply pending migrations, then serve JSON-RPC on /cstp."""
    import uvicorn

    from ..auth import LOCAL_AGENT, ensure_local_token, load_tokens
    from ..guardrails.rules import RuleFileError

    settings = load_settings()
    _setup_logging("DEBUG" if debugging() else settings.log_level)
    host = host or settings.host
    port = port or settings.port
    try:
        tokens = load_tokens(settings)
        _preflight(settings)
    except (ConfigError, RuleFileError) as exc:
        # Shown whole, even with --debug: a YAML syntax error's lines point at the mistake.
        raise click.ClickException(str(exc)) from None
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    run(lambda: ensure_schema(settings.database_url, upgrade_older=True))
    if not tokens:
        _token, created = ensure_local_token(settings.data_dir)
        path = (settings.data_dir / "local-token").absolute()
        click.echo(
            f"No CSTP_AUTH_TOKENS set: {'created' if created else 'using'} a token for agent "
            f"'{LOCAL_AGENT}' in {path}\n"
            f"  export CSTP_TOKEN=$(cat {path})\n"
            f'  curl -H "Authorization: Bearer $CSTP_TOKEN" http://{host}:{port}/cstp ...',
            err=True,
        )
    click.echo(
        f"database: {redact(settings.database_url)}\n"
        f"decisions: {settings.decisions_dir.absolute()}\n"
        f"vector index: {settings.chroma_url or (settings.data_dir / 'chroma').absolute()}\n"
        f"listening on http://{host}:{port}",
        err=True,
    )
    if workers > 1 and not settings.chroma_url:
        raise Failure(
            "several workers need a Chroma server (CSTP_CHROMA_URL): the embedded index is "
            "not safe across processes"
        )
    uvicorn.run(
        "app.asgi:serving_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=settings.log_level.lower(),
        access_log=False,
    )


def _preflight(settings: Settings) -> None:
    """What the server process checks when it starts, checked here before it is started, so a
    mistake is one line on stderr instead of a traceback after "listening on"."""
    from ..asgi import build_registry, check_rate_limits
    from ..guardrails.rule_files import load_rules, rule_dirs
    from ..observability import tracing

    check_rate_limits(settings, build_registry())
    load_rules(rule_dirs(settings.guardrails_dir))
    tracing.from_env(settings.trace_content)  # OTEL_* asking for traces it cannot send
