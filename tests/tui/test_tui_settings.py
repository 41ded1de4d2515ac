"""--refresh and --theme are remembered in an XDG config file; a bad theme is a one-line usage error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gputop.tui import settings


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    return tmp_path


def test_saved_settings_come_back(config_home: Path) -> None:
    assert settings.load() == settings.Settings()
    settings.save(settings.Settings(refresh_s=2.0, theme="textual-light"))
    assert settings.config_path() == config_home / "gputop" / "config.toml"
    assert settings.load() == settings.Settings(refresh_s=2.0, theme="textual-light")


def test_a_broken_file_is_ignored_with_a_warning(config_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = config_home / "gputop" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text("refresh_s = = 1\n")
    assert settings.load() == settings.Settings()
    assert "ignoring" in capsys.readouterr().err
    path.write_text("refresh_s = -1\ntheme = 3\n")  # nonsense values: the defaults apply
    assert settings.load() == settings.Settings()


def test_an_unknown_theme_is_a_usage_error(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "gputop", "attach", "--port", "34311", "--theme", "no-such-theme"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 2
    assert "argument --theme: unknown theme 'no-such-theme'; one of: textual-dark" in result.stderr.splitlines()[-1]
    assert not (tmp_path / "gputop" / "config.toml").exists()
