"""The directory the worker processes of one ``cstp serve`` share for their metrics: the
library's value files (its multiprocess mode) and the chain verification's schedule
(app.system.chain_verification). Set up by ``cstp serve`` before any process imports the library,
which chooses once, when imported, where it keeps values: so this module must not import it.
"""

from __future__ import annotations

import os
from pathlib import Path

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Ours, beside the library's files: when the chain was last verified, and who verifies now.
VERIFIED_FILE = "audit-verified"
VERIFY_LOCK_FILE = "audit-verify.lock"


def prepare(folder: Path) -> Path:
    """Make ``folder`` the shared directory of the server processes started after this call,
    emptied of an earlier run's files (their counts are not this run's). Returns it,
    absolute."""
    folder = folder.absolute()
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.db"):  # the library's value files, one per process and kind
        stale.unlink()
    for ours in (VERIFIED_FILE, VERIFY_LOCK_FILE):
        (folder / ours).unlink(missing_ok=True)
    os.environ[MULTIPROC_ENV] = str(folder)
    return folder
