"""The settings reporters read: the token, TLS, and GPUTOP_DISABLE."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from gputop import auth
from gputop.doctor.checks import (
    DISABLE,
    TLS,
    TOKEN,
    Check,
)


def check_token(env: Mapping[str, str]) -> Check:
    if auth.Security.from_env(env).token:
        return Check(TOKEN, "ok", "GPUTOP_TOKEN set (not shown)", facts={"set": True})
    return Check(TOKEN, "note", "GPUTOP_TOKEN not set (a collector off loopback demands one)", facts={"set": False})


def check_tls(env: Mapping[str, str]) -> Check:
    names = ("GPUTOP_TLS_CA", "GPUTOP_TLS_CERT", "GPUTOP_TLS_KEY")
    settings = {name: env[name] for name in names if env.get(name)}
    if not settings:
        return Check(TLS, "note", "GPUTOP_TLS_CA, GPUTOP_TLS_CERT, GPUTOP_TLS_KEY not set (plain TCP)", facts={})
    facts: dict[str, Any] = {}
    problems = []
    for name, value in settings.items():
        state = "the system's CAs" if name == "GPUTOP_TLS_CA" and value == "system" else file_state(value)
        facts[name] = {"path": value, "state": state}
        if state not in ("readable", "the system's CAs"):
            problems.append(f"{name}={value}: {state}")
    fix = "point each at a readable PEM file"
    if "GPUTOP_TLS_KEY" in settings and "GPUTOP_TLS_CERT" not in settings:
        problems.append("GPUTOP_TLS_KEY without GPUTOP_TLS_CERT: a listener serves TLS only with a certificate")
        fix = "set GPUTOP_TLS_CERT too" if len(problems) == 1 else fix
    if problems:
        return Check(TLS, "problem", ", ".join(problems), fix=fix, facts=facts)
    summary = ", ".join(f"{name} {facts[name]['state']}" for name in settings)
    return Check(TLS, "ok", summary, facts=facts)


def file_state(path: str) -> str:
    if not os.path.exists(path):
        return "no such file"
    if not os.path.isfile(path):
        return "not a file"
    return "readable" if os.access(path, os.R_OK) else "not readable by this user"


def check_disable(env: Mapping[str, str]) -> Check:
    value = env.get("GPUTOP_DISABLE", "")
    if value in ("", "0"):  # the reporter's own rule (gputop.reporter)
        return Check(DISABLE, "ok", "GPUTOP_DISABLE not set: training reports", facts={"set": False})
    return Check(
        DISABLE,
        "problem",
        f"GPUTOP_DISABLE={value}: every gputop call in training started from here does nothing",
        fix="unset it",
        facts={"set": True, "value": value},
    )
