"""Deprecated location of the terminal client, kept only for old imports.

The client now lives in the ``app.client`` package; import from there. This module can be
deleted once nothing imports ``app.client_cli`` (tests/integration/test_client_cli.py does).
"""

from app.client import register_client_commands
from app.client.options import parse_pairs
from app.client.transport import endpoint, rpc_error_line

__all__ = ["endpoint", "parse_pairs", "register_client_commands", "rpc_error_line"]
