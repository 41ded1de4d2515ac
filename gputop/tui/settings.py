"""The dashboard's remembered preferences: refresh period, theme, automatic profiles; in an XDG config file.

``$XDG_CONFIG_HOME/gputop/config.toml`` (else ``~/.config/gputop/config.toml``)::

    refresh_s = 1.0
    theme = "textual-light"
    auto_capture = false    # never profile a finding's culprit rank by itself (written by hand only)
    gpu_hour_price = 2.5    # what a GPU-hour costs you, for every command (written by hand only)

Read at start as the defaults that command-line options override; written when
``--refresh`` or ``--theme`` is given, and when the theme is changed in the app
(Textual's command palette), so the next start looks the same; ``auto_capture``
and ``gpu_hour_price`` are only read (``--no-auto-capture`` and ``--gpu-hour-price``
override them for one start; the price is every command's default, the report's too).  A broken file
is ignored with a one-line warning: preferences never stop the dashboard.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, published as tomli before it joined the standard library
    import tomli as tomllib

DEFAULT_REFRESH_S = 0.5
DEFAULT_THEME = "textual-dark"


@dataclass(frozen=True)
class Settings:
    """What the user chose last; None: never chosen (the defaults apply)."""

    refresh_s: float | None = None
    theme: str | None = None
    auto_capture: bool | None = None  # False: off, as with --no-auto-capture (set in the file by hand)
    gpu_hour_price: float | None = None  # --gpu-hour-price's default (set in the file by hand)


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gputop" / "config.toml"


def load(path: Path | None = None) -> Settings:
    """The saved settings; empty ones when there is no file, and a warning on stderr when it is unreadable."""
    path = path or config_path()
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return Settings()
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        print(f"gputop: ignoring {path}: {exc}", file=sys.stderr)
        return Settings()
    refresh = data.get("refresh_s")
    theme = data.get("theme")
    auto_capture = data.get("auto_capture")
    price = data.get("gpu_hour_price")
    return Settings(
        refresh_s=float(refresh) if isinstance(refresh, int | float) and refresh > 0 else None,
        theme=theme if isinstance(theme, str) and theme else None,
        auto_capture=auto_capture if isinstance(auto_capture, bool) else None,
        gpu_hour_price=float(price)
        if isinstance(price, int | float) and not isinstance(price, bool) and price > 0
        else None,
    )


def save(settings: Settings, path: Path | None = None) -> None:
    """Write the settings (only the chosen ones); a file that cannot be written is skipped with a warning."""
    path = path or config_path()
    lines = ["# gputop's remembered preferences (written by gputop; --refresh and --theme override)"]
    if settings.refresh_s is not None:
        lines.append(f"refresh_s = {settings.refresh_s!r}")
    if settings.theme is not None:
        lines.append(f'theme = "{settings.theme}"')
    if settings.auto_capture is not None:
        lines.append(f"auto_capture = {str(settings.auto_capture).lower()}")
    if settings.gpu_hour_price is not None:
        lines.append(f"gpu_hour_price = {settings.gpu_hour_price!r}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
    except OSError as exc:
        print(f"gputop: could not save preferences to {path}: {exc}", file=sys.stderr)
