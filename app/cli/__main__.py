"""``python -m app.cli``: the ``cstp`` command (as bench/server.py starts the server)."""

from . import main

main()
