"""The settings in force here: every one with its value and source, and the three that decide a connection.

``check_settings`` lists what ``gputop.settings`` resolves from this environment
and the config file (a flag is never in force for doctor); the token, TLS and
GPUTOP_DISABLE each get a check of their own, because each can stop training
from reporting.  A secret's value is never shown, only whether it is set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gputop import auth, settings
from gputop.doctor.checks import (
    DISABLE,
    SETTINGS,
    TLS,
    TOKEN,
    Check,
    Status,
)
from gputop.settings import config_file

TLS_SETTINGS = (settings.TLS_CA, settings.TLS_CERT, settings.TLS_KEY)


def check_settings(env: Mapping[str, str], path: Path | None = None) -> Check:
    """Every setting in force, one detail line each: name, where its value came from, the value."""
    path = path or config_file.config_path(env)
    problems = []
    try:
        table = config_file.read(path)
    except config_file.ConfigFileError as exc:
        table = {}
        problems.append(str(exc))
    in_force = settings.resolve(env, file=table)
    problems += [reading.problem for reading in in_force if reading.problem]
    width = max(len(s.name) for s in settings.SETTINGS)
    details = tuple(f"{r.setting.name:<{width}}  {r.source:<7}  {r.shown}" for r in in_force)
    facts = {"config_file": str(path), "settings": [_as_json(reading) for reading in in_force]}
    if problems:  # a value passed over for the default is worth knowing; one that stops reporting is not ok
        status: Status = "problem" if any(reading.stops for reading in in_force) else "note"
        return Check(SETTINGS, status, "; ".join(problems), fix="correct or unset it", details=details, facts=facts)
    chosen = [reading.setting.name for reading in in_force if reading.source != "default"]
    summary = f"{len(chosen)} of {len(in_force.readings)} set here" + (f" ({', '.join(chosen)})" if chosen else "")
    summary += f"; config file {path}" + ("" if path.is_file() else " (none)")
    return Check(SETTINGS, "ok", summary, details=details, facts=facts)


def _as_json(reading: settings.Reading[Any]) -> dict[str, Any]:
    value = reading.value
    if reading.setting.secret:
        value = reading.shown
    elif isinstance(value, Path):
        value = str(value)
    found = {"name": reading.setting.name, "key": reading.setting.key, "value": value, "source": reading.source}
    return {**found, "problem": reading.problem} if reading.problem else found


def check_token(env: Mapping[str, str]) -> Check:
    name = settings.TOKEN.env
    if auth.Security.from_env(env).token:
        return Check(TOKEN, "ok", f"{name} set (not shown)", facts={"set": True})
    return Check(TOKEN, "note", f"{name} not set (a collector off loopback demands one)", facts={"set": False})


def check_tls(env: Mapping[str, str]) -> Check:
    chosen = {s.env: s.value(env) for s in TLS_SETTINGS if s.value(env)}
    if not chosen:
        return Check(TLS, "note", f"{', '.join(s.env for s in TLS_SETTINGS)} not set (plain TCP)", facts={})
    facts: dict[str, Any] = {}
    problems = []
    for name, value in chosen.items():
        state = "the system's CAs" if name == settings.TLS_CA.env and value == "system" else file_state(value)
        facts[name] = {"path": value, "state": state}
        if state not in ("readable", "the system's CAs"):
            problems.append(f"{name}={value}: {state}")
    fix = "point each at a readable PEM file"
    key, cert = settings.TLS_KEY.env, settings.TLS_CERT.env
    if key in chosen and cert not in chosen:
        problems.append(f"{key} without {cert}: a listener serves TLS only with a certificate")
        fix = f"set {cert} too" if len(problems) == 1 else fix
    if problems:
        return Check(TLS, "problem", ", ".join(problems), fix=fix, facts=facts)
    summary = ", ".join(f"{name} {facts[name]['state']}" for name in chosen)
    return Check(TLS, "ok", summary, facts=facts)


def file_state(path: str) -> str:
    if not os.path.exists(path):
        return "no such file"
    if not os.path.isfile(path):
        return "not a file"
    return "readable" if os.access(path, os.R_OK) else "not readable by this user"


def check_disable(env: Mapping[str, str]) -> Check:
    name = settings.DISABLE.env
    if not settings.DISABLE.value(env):
        return Check(DISABLE, "ok", f"{name} not set: training reports", facts={"set": False})
    value = env[name]
    return Check(
        DISABLE,
        "problem",
        f"{name}={value}: every gputop call in training started from here does nothing",
        fix="unset it",
        facts={"set": True, "value": value},
    )
