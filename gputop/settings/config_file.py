"""The config file: the settings that ``gputop.settings`` reads from a file, in TOML.

``$XDG_CONFIG_HOME/gputop/config.toml`` (else ``~/.config/gputop/config.toml``)::

    refresh_s = 1.0
    theme = "textual-light"
    auto_capture = false    # never profile a finding's culprit rank by itself (written by hand only)
    gpu_hour_price = 2.5    # what a GPU-hour costs you, for every command (written by hand only)

Every command that takes one of these flags reads the file as their default
(``gputop.cli``); the dashboard writes it when ``--refresh`` or ``--theme`` is
given, and when the theme is changed in the app (Textual's command palette), so
the next start looks the same.  A broken file reads as empty, with a one-line
warning: preferences never stop a command.  A key with a bad value is the
setting's default (``gputop doctor`` says which).

Apart from the registry because TOML is parsed here: training processes never load this module.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gputop.settings import IN_FILE, Setting

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, published as tomli before it joined the standard library
    import tomli as tomllib


class ConfigFileError(Exception):
    """A config file that exists but cannot be read; one line."""


def config_path(env: Mapping[str, str] = os.environ) -> Path:
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gputop" / "config.toml"


def read(path: Path | None = None) -> dict[str, object]:
    """The file's table, as TOML reads it ({} when there is no file); ConfigFileError when it is unreadable."""
    path = path or config_path()
    try:
        table: dict[str, object] = tomllib.loads(path.read_text())  # Any where tomli is not installed
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"ignoring {path}: {exc}") from None
    return table


def load(path: Path | None = None) -> dict[str, object]:
    """The file's table; empty when there is no file, and with a warning on stderr when it is unreadable."""
    try:
        return read(path)
    except ConfigFileError as exc:
        print(f"gputop: {exc}", file=sys.stderr)
        return {}


def remember(values: Mapping[str, object], path: Path | None = None) -> None:
    """Set these keys in the file, keeping the others it holds; written only when one changes."""
    path = path or config_path()
    try:
        table = read(path)
    except ConfigFileError:  # said when it was loaded; replaced by what is remembered now
        table = {}
    if any(table.get(key) != value for key, value in values.items()):
        save({**table, **values}, path)


def save(values: Mapping[str, object], path: Path | None = None) -> None:
    """Write the file's settings that ``values`` holds good values for; a file that cannot be written is said."""
    path = path or config_path()
    lines = ["# gputop's remembered preferences (written by gputop; --refresh and --theme override)"]
    lines += [f"{s.key} = {_toml(values[s.key])}" for s in IN_FILE if _fits(s, values.get(s.key))]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
    except OSError as exc:
        print(f"gputop: could not save preferences to {path}: {exc}", file=sys.stderr)


def _fits(setting: Setting[Any], value: object) -> bool:
    """Whether the file may hold it: a bad value read from the file is not written back."""
    if value is None or setting.from_file is None:
        return False
    try:
        setting.from_file(value)
    except ValueError:
        return False
    return True


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's
