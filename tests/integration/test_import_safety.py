"""`cstp import` of a hostile tree: YAML aliases (a "billion laughs" file), symbolic links out
of the tree, files past the size cap and fields past the API's limits are each listed with a
reason, and the rest of the tree is imported."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from app.cli import main
from app.config import Settings

GOOD = "decision: Adopt feature flags\ncategory: process\nconfidence: 0.7\ndate: 2025-01-03\n"


def billion_laughs() -> str:
    """Ten levels of anchors, each holding ten aliases of the one before: ~1 KB of text that
    a loader expands to 10^10 leaves."""
    lines = ['a0: &a0 "lol"']
    for level in range(1, 10):
        aliases = ", ".join([f"*a{level - 1}"] * 10)
        lines.append(f"a{level}: &a{level} [{aliases}]")
    return (
        GOOD
        + "affected_kpis:\n"
        + "\n".join("  " + line for line in lines)
        + "\noutcome: success\n"
    )


def env(settings: Settings, max_body: int | None = None) -> dict[str, str]:
    out = {
        "CSTP_DATABASE_URL": settings.database_url,
        "CSTP_DATA_DIR": str(settings.data_dir),
        "CSTP_DECISIONS_DIR": str(settings.decisions_dir),
        "CSTP_AUTH_TOKENS": "alice:token-alice",
    }
    if max_body is not None:
        out["CSTP_MAX_BODY_BYTES"] = str(max_body)
    return out


@pytest.mark.usefixtures("commands_share_the_model")
def test_a_hostile_tree_is_listed_file_by_file_and_the_rest_imported(
    settings: Settings, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    (journal / "2025").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.yaml"
    secret.write_text(GOOD.replace("Adopt feature flags", "A file outside the tree"))
    (journal / "good.yaml").write_text(GOOD)
    (journal / "laughs.yaml").write_text(billion_laughs())
    (journal / "one-alias.yaml").write_text(GOOD + "tags: &t [a, b]\nkpi_indicators: *t\n")
    (journal / "link.yaml").symlink_to(secret)
    (journal / "linked-dir").symlink_to(outside, target_is_directory=True)
    (journal / "2025" / "big.yaml").write_text(GOOD + "context: " + "x" * 40_000 + "\n")
    deep = "1"
    for _ in range(400):
        deep = "{a: " + deep + "}"
    (journal / "deep-kpis.yaml").write_text(GOOD + f"outcome: failure\naffected_kpis: {deep}\n")
    (journal / "many-tags.yaml").write_text(
        yaml.safe_dump({**yaml.safe_load(GOOD), "tags": [f"t{i}" for i in range(101)]})
    )
    (journal / "long-decision.yaml").write_text(GOOD.replace("Adopt feature flags", "x" * 20_001))
    (journal / "long-kpi.yaml").write_text(GOOD + f"kpi_indicators: [{'k' * 257}]\n")

    result = CliRunner().invoke(main, ["import", str(journal)], env=env(settings, 32_768))
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    reasons = dict(re.findall(r"could not import (\S+): (.+)", result.output))
    assert reasons == {
        "laughs.yaml": "YAML aliases are not accepted (line 7)",
        "one-alias.yaml": "YAML aliases are not accepted (line 6)",
        "link.yaml": "a symbolic link: not followed",
        "linked-dir": "a symbolic link: not followed",
        "2025/big.yaml": "larger than 32768 bytes (CSTP_MAX_BODY_BYTES)",
        "deep-kpis.yaml": "affected_kpis.a.a.a.a.a.a.a.a: is nested more than 8 levels deep",
        "many-tags.yaml": "tags: must have a count <= 100",
        "long-decision.yaml": "decision: length must be <= 20000",
        "long-kpi.yaml": "kpi_indicators[0]: length must be <= 256",
    }, result.output
    assert "files 10, new 1, already present 0, failed 9" in result.output, result.output
    exported = [p.read_text() for p in settings.decisions_dir.rglob("*.yaml")]
    assert len(exported) == 1 and "Adopt feature flags" in exported[0]
    assert not any("outside the tree" in text for text in exported)
