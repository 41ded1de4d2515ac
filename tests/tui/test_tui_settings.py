"""--refresh and --theme are remembered in the config file; a bad theme is a one-line usage error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gputop.cli import parse_args
from gputop.settings import config_file


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    return tmp_path


def test_remembered_settings_come_back(config_home: Path) -> None:
    assert config_file.load() == {}
    config_file.remember({"refresh_s": 2.0, "theme": "textual-light"})
    assert config_file.config_path() == config_home / "gputop" / "config.toml"
    args = parse_args(["attach"])
    assert (args.refresh_s, args.theme) == (2.0, "textual-light")


def test_a_broken_file_is_ignored_with_a_warning(config_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = config_home / "gputop" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text("refresh_s = = 1\n")
    assert config_file.load() == {}
    assert "ignoring" in capsys.readouterr().err
    path.write_text("refresh_s = -1\ntheme = 3\n")  # nonsense values: the defaults apply
    args = parse_args(["attach"])
    assert (args.refresh_s, args.theme) == (0.5, "textual-dark")


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
