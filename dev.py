#!/usr/bin/env python3
"""The two commands of the README, needing nothing but Python 3.11+:

    python3 dev.py serve [cstp serve options]   # start the server on the embedded default
    python3 dev.py test [pytest options]        # run the whole test suite

and the house rules' checks, which CI runs before the tests:

    python3 dev.py check                        # ruff check, ruff format --check, mypy

and the console's screenshots in docs/console/ (docs/CONSOLE.md), taken by its browser tests:

    python3 dev.py screenshots                  # needs Debian's chromium package

On first use (and whenever pyproject.toml changes) it creates ./.venv and installs the project
(editable) with its test extras.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
STAMP = VENV / ".cstp-installed"


def _fingerprint() -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()


def ensure_venv() -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 - dev.py runs on any python3 to say this
        sys.exit("Python 3.11 or newer is needed")
    if STAMP.exists() and STAMP.read_text() == _fingerprint():
        return
    if not (BIN / "python").exists():
        print("creating .venv ...", file=sys.stderr)
        venv.create(VENV, with_pip=True)
    pip = [str(BIN / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    print("installing the project into .venv (first run takes a few minutes) ...", file=sys.stderr)
    subprocess.run([*pip, "-e", f"{ROOT}[test]"], check=True)
    STAMP.write_text(_fingerprint())


def check() -> int:
    """Lint, format and types, each reported; non-zero when any of them fails."""
    sources = ["app", "tests", "bench", "dev.py"]
    steps = [
        ("lint", [str(BIN / "ruff"), "check", *sources]),
        ("format", [str(BIN / "ruff"), "format", "--check", *sources]),
        ("types", [str(BIN / "mypy")]),  # strict, on app/ (pyproject.toml)
    ]
    failed = []
    for name, argv in steps:
        print(
            f"== {name}: {' '.join(Path(a).name if a.startswith(str(BIN)) else a for a in argv)}",
            file=sys.stderr,
            flush=True,
        )
        if subprocess.call(argv, cwd=ROOT) != 0:
            failed.append(name)
    if failed:
        print(f"check failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in {"serve", "test", "cstp", "check", "screenshots"}:
        print(__doc__, file=sys.stderr)
        return 2
    ensure_venv()
    command, args = sys.argv[1], sys.argv[2:]
    if command == "check":
        return check()
    if command == "serve":
        argv = [str(BIN / "cstp"), "serve", *args]
    elif command == "cstp":
        argv = [str(BIN / "cstp"), *args]
    elif command == "screenshots":
        os.environ["CSTP_CONSOLE_SCREENSHOTS"] = str(ROOT / "docs" / "console")
        os.environ["CSTP_REQUIRE_BROWSER"] = "1"  # no browser: fail, never skip
        argv = [
            str(BIN / "python"),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/browser",
        ]
    else:
        argv = [str(BIN / "python"), "-m", "pytest", *args]
    # Hand the process over rather than wait on a child: a signal sent to this process (a
    # process manager's SIGTERM, a script's kill) must reach the server or the test run.
    os.chdir(ROOT)
    os.execv(argv[0], argv)


if __name__ == "__main__":
    sys.exit(main())
