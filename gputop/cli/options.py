"""The options several commands take, and the argument types that check them (one line each when wrong).

A flag that sets one of ``gputop.settings`` has that setting's key as its dest and None as its default (not
given): ``gputop.cli.parse_args`` then fills in the config file's value or the default.
"""

from __future__ import annotations

import argparse

from gputop import settings


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be greater than 0")
    return value


def non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must not be negative")
    return value


def theme_name(text: str) -> str:
    from textual.theme import BUILTIN_THEMES

    if text not in BUILTIN_THEMES:
        raise argparse.ArgumentTypeError(f"unknown theme {text!r}; one of: {', '.join(BUILTIN_THEMES)}")
    return text


def rank_list(text: str) -> list[int]:
    try:
        ranks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rank or a comma-separated list of ranks") from None
    if not ranks or any(r < 0 for r in ranks):
        raise argparse.ArgumentTypeError(f"{text!r}: ranks are numbers from 0")
    return list(dict.fromkeys(ranks))


def capture_steps(text: str) -> int:
    from gputop.protocol import MAX_CAPTURE_STEPS

    try:
        steps = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= steps <= MAX_CAPTURE_STEPS:
        raise argparse.ArgumentTypeError(f"--steps must be from 1 to {MAX_CAPTURE_STEPS}")
    return steps


def add_address(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--port", type=int, help="listen on TCP 127.0.0.1:PORT (runs started with GPUTOP_PORT=PORT)")
    group.add_argument("--socket", metavar="PATH", help="listen on this Unix socket instead of the per-user default")
    group.add_argument(
        "--listen",
        metavar="ADDR:PORT",
        help="listen on TCP ADDR:PORT for ranks on other hosts (GPUTOP_ADDR=HOST:PORT); off loopback it needs "
        "GPUTOP_TOKEN; GPUTOP_TLS_CERT/GPUTOP_TLS_KEY add TLS",
    )


def add_prometheus(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prometheus",
        metavar="[ADDR]:PORT",
        help="also serve Prometheus metrics on ADDR:PORT (:9464 = every interface); see docs/prometheus.md",
    )


def add_live_collector(parser: argparse.ArgumentParser) -> None:
    """What a live collector is started with (``gputop attach``, ``gputop mcp``): where, and what else it serves."""
    add_address(parser)
    add_prometheus(parser)


def add_dashboard_options(parser: argparse.ArgumentParser) -> None:
    add_alert_after(parser)
    add_auto_capture(parser)
    add_price(parser)
    add_look(parser)
    add_sample_interval(parser)


def add_look(parser: argparse.ArgumentParser) -> None:
    """How the dashboard looks: remembered in the config file for the next start."""
    parser.add_argument(
        "--refresh", dest=settings.REFRESH_S.key, type=positive, default=None, metavar="S",
        help=f"redraw every S seconds (default {settings.REFRESH_S.default:g}; remembered)",
    )  # fmt: skip
    parser.add_argument(
        "--theme", dest=settings.THEME.key, type=theme_name, default=None,
        help="a Textual theme, e.g. textual-light (remembered)",
    )  # fmt: skip


def add_sample_interval(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--interval", type=positive, default=1.0, metavar="S", help="sample GPUs and host every S seconds (default 1)"
    )


def add_price(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gpu-hour-price", dest=settings.GPU_HOUR_PRICE.key, type=positive, default=None, metavar="PRICE",
        help="what a GPU-hour costs you: findings then say what their waste comes to in money",
    )  # fmt: skip


def add_alert_after(parser: argparse.ArgumentParser) -> None:
    from gputop.diagnose.alerts import HOLD_S

    parser.add_argument(
        "--alert-after",
        type=non_negative,
        default=HOLD_S,
        metavar="S",
        help=f"a warn/critical finding alerts once it has held S seconds (default {HOLD_S:g})",
    )


def add_auto_capture(parser: argparse.ArgumentParser, *, when: str = "") -> None:
    from gputop.diagnose.autocapture import CAPTURE_MIN_INTERVAL_S

    parser.add_argument(
        "--no-auto-capture", dest=settings.AUTO_CAPTURE.key, action="store_false", default=None,
        help="do not profile a straggler's or stall's culprit rank once the finding has held --alert-after "
        f"seconds (at most one short torch.profiler capture per run every {CAPTURE_MIN_INTERVAL_S / 60:g} minutes)"
        f"{when}",
    )  # fmt: skip
