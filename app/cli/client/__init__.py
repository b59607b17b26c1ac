"""The terminal client: ``cstp query``, ``record``, ``review``, ``get``, ``list``, ``check``,
``announce``, ``calibration`` and ``guardrails`` talk to a running CSTP server over JSON-RPC.

Each command makes one synchronous HTTP request to ``CSTP_URL`` (default
``http://127.0.0.1:9991``; the ``/cstp`` path is added when missing) with the bearer token
``CSTP_TOKEN`` (``--url`` / ``--token`` override them). By default the answer is printed for
people (aligned columns, ``key: value`` lines); ``--json`` prints the JSON-RPC ``result``
as pretty UTF-8 JSON for scripts.

Every failure (server unreachable, token refused, HTTP error, JSON-RPC error) is one line on
stderr and exit code 1, never a traceback. Params are validated by the server, not here, so
the client never disagrees with it: a bad value comes back as the server's -32602 naming the
field.

Layout: ``transport`` (URL and token, the one HTTP call, every failure as one line),
``render`` (tables, ``key: value`` lines, JSON), ``options`` (shared options and param
parsing), ``decisions`` and ``guidance`` (the commands), ``commands`` (registration).
"""

from .commands import register_client_commands

__all__ = ["register_client_commands"]
