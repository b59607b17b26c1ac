"""CSTP_AUDIT_KEY / CSTP_AUDIT_KEY_FILE: read when the settings are, refused when unusable."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import ConfigError, Settings, audit_key_from_env


def test_no_key_is_a_plain_chain() -> None:
    assert audit_key_from_env({}) is None
    assert Settings.from_env({}).audit_key is None


def test_the_key_from_the_variable_or_a_file(tmp_path: Path) -> None:
    assert audit_key_from_env({"CSTP_AUDIT_KEY": " 0123456789abcdef0123 "}) == (
        b"0123456789abcdef0123"
    )
    key_file = tmp_path / "key"
    key_file.write_text("fedcba9876543210fedcba\n", encoding="utf-8")
    settings = Settings.from_env({"CSTP_AUDIT_KEY_FILE": str(key_file)})
    assert settings.audit_key == b"fedcba9876543210fedcba"
    assert "fedcba" not in repr(settings)  # never shown


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CSTP_AUDIT_KEY": "short"}, "at least 16 bytes"),
        ({"CSTP_AUDIT_KEY": "x" * 20, "CSTP_AUDIT_KEY_FILE": "/k"}, "not both"),
        ({"CSTP_AUDIT_KEY_FILE": "/no/such/key"}, "cannot read the audit key"),
    ],
)
def test_an_unusable_key_stops_start_up(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_env(env)
