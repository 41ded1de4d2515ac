"""Every setting gputop reads, in one place: its type, its one default, what it means, and where it is read.

A setting takes its value from the first of these that has one: a command-line
flag, an environment variable (``GPUTOP_*``), a key in the config file
(``$XDG_CONFIG_HOME/gputop/config.toml``, read and written by
``gputop.settings.config_file``), else its default.  An empty variable is unset.

Readers ask the setting, not the environment (``WINDOW_S.value()``), so what a
bad value does is decided here, once per setting: one that ``falls_back`` reads
a bad value as its default; any other raises ``SettingError``, one line naming
the variable and its value, and its reader decides what that stops (``if_bad``
says what).  ``resolve`` gives every setting in force with where its value came
from and, for a bad value, the line that says so: ``gputop doctor`` prints it.

What a setting is, and the kinds of value it parses, are ``setting``.  Every
training process loads both, so they import only what the reporter loads anyway;
the config file's TOML parsing lives in ``config_file``, which the reporter never
imports (an import contract in pyproject.toml).

Read from the environment but not settings, so not here: ``GPUTOP_DEMO_PID``
(``gputop demo`` hands it to its own ranks), ``XDG_RUNTIME_DIR`` and
``XDG_CONFIG_HOME`` (where the socket and the config file go, by the XDG rule),
the launchers' variables a run's id is derived from (``SLURM_JOB_ID``,
``TORCHELASTIC_RUN_ID``, ``MASTER_PORT``...) and torch's own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gputop.settings import setting as kinds
from gputop.settings.setting import InForce as InForce
from gputop.settings.setting import Reading as Reading
from gputop.settings.setting import Setting as Setting
from gputop.settings.setting import SettingError as SettingError
from gputop.settings.setting import Source as Source

# On CUDA, DDP's own rate (every 100th iteration) stands: each iteration DDP times, it waits for that iteration's
# CUDA events on the training thread at the next forward, and gputop adds no wait of its own (docs/architecture.md).
DDP_SAMPLE_RATE_CPU = 1  # timing a CPU iteration costs nothing next to it
# A window's bounds.  The figures read a 10-s span (gputop.model.figures.SPAN_S) and a live view copies each
# rank's newest 40 windows (SPAN_COPY_WINDOWS): under 0.25 s those no longer cover the span; a share is called
# with a band of 3 windows or more, so over 3 s a span never holds enough.  A test keeps these in step.
WINDOW_S_RANGE = (0.25, 3.0)
STACKS_HZ_RANGE = (0.5, 200.0)
NICE_RANGE = (0, 19)  # what nice(2) accepts as a lowered priority; 0: not lowered

# -- the registry ---------------------------------------------------------------------------------------------

# Where reporters send and a collector listens: gputop.address takes --listen, --port, --socket, then these in order.
PORT: Setting[int | None] = Setting(
    key="port",
    meaning="report to `gputop attach --port N` on 127.0.0.1 instead of the per-user socket "
    "(a collector started without an address listens there)",
    default=None,
    default_text="the per-user socket",
    kind="port",
    env="GPUTOP_PORT",
    parse=kinds.port,
    flags=("--port",),
    if_bad="training started with it reports nothing, and a collector does not start",
)
ADDR: Setting[str | None] = Setting(
    key="addr",
    meaning="report over TCP to `gputop attach/record --listen ADDR:PORT` on another host",
    default=None,
    default_text="the per-user socket",
    kind="HOST:PORT",
    env="GPUTOP_ADDR",
    parse=kinds.as_is,  # checked where it is used, by gputop.address, as --listen and --addr are
    flags=("--listen", "--addr"),
)
SOCKET: Setting[Path | None] = Setting(
    key="socket",
    meaning="report to another Unix socket",
    default=None,
    default_text="the per-user socket",
    kind="path",
    env="GPUTOP_SOCKET",
    parse=kinds.as_path,
    flags=("--socket",),
)

# What secures a TCP connection (gputop.auth).
TOKEN: Setting[str] = Setting(
    key="token",
    meaning="the shared token a network listener demands (proved by HMAC, never sent)",
    default="",
    kind="text",
    env="GPUTOP_TOKEN",
    parse=kinds.as_is,
    secret=True,
)
TLS_CA: Setting[str] = Setting(
    key="tls_ca",
    meaning="TLS: the CA reporters verify the collector with (`system`: the system's CAs; docs/protocol.md)",
    default="",
    default_text="plain TCP",
    kind="PEM file",
    env="GPUTOP_TLS_CA",
    parse=kinds.as_is,
)
TLS_CERT: Setting[str] = Setting(
    key="tls_cert",
    meaning="TLS: the certificate chain a listener serves",
    default="",
    default_text="plain TCP",
    kind="PEM file",
    env="GPUTOP_TLS_CERT",
    parse=kinds.as_is,
)
TLS_KEY: Setting[str] = Setting(
    key="tls_key",
    meaning="TLS: the listener's private key",
    default="",
    default_text="plain TCP",
    kind="PEM file",
    env="GPUTOP_TLS_KEY",
    parse=kinds.as_is,
)

# What a training process does (gputop.reporter).
DISABLE: Setting[bool] = Setting(
    key="disable",
    meaning="every gputop call is a no-op (any value but `0`)",
    default=False,
    kind="1 or 0",
    env="GPUTOP_DISABLE",
    parse=kinds.not_zero,
)
RUN_ID: Setting[str | None] = Setting(
    key="run_id",
    meaning="the name ranks report under",
    default=None,
    default_text="derived from the launcher",
    kind="text",
    env="GPUTOP_RUN_ID",
    parse=kinds.as_is,
)
WINDOW_S: Setting[float] = Setting(
    key="window_s",
    meaning="how often each rank sends a summary (0.25-3 s: the figures read 10 s of them)",
    default=1.0,
    kind="seconds",
    env="GPUTOP_WINDOW_S",
    parse=kinds.number_in_range(*WINDOW_S_RANGE, "seconds"),
    if_bad="training started with it reports nothing",
)
DDP_SAMPLE_RATE: Setting[int | None] = Setting(
    key="ddp_sample_rate",
    meaning="DDP times every Nth iteration (PyTorch's default is 100; below 1 reads as 1)",
    default=None,
    default_text=f"DDP's own on CUDA, {DDP_SAMPLE_RATE_CPU} on the CPU",
    kind="whole number",
    env="GPUTOP_DDP_SAMPLE_RATE",
    parse=kinds.at_least_one,
    if_bad="DDP keeps its own rate (every 100th iteration)",
)
CUDA_EVENTS: Setting[bool] = Setting(
    key="cuda_events",
    meaning="CUDA events at step marks and phase hooks, for the GPU step time and, off DDP, the phases (`0`: none)",
    default=True,
    kind="1 or 0",
    env="GPUTOP_CUDA_EVENTS",
    parse=kinds.not_zero,
)
TRACE_DIR: Setting[Path | None] = Setting(
    key="trace_dir",
    meaning="where profiler captures write their traces",
    default=None,
    default_text="<tmp>/gputop-traces-<uid>",
    kind="path",
    env="GPUTOP_TRACE_DIR",
    parse=kinds.as_path,
)
STACKS: Setting[bool] = Setting(
    key="stacks",
    meaning="sample where the training thread is, for the detail screen and the findings' function and line "
    "(`0`, `off`: do not)",
    default=True,
    kind="on or off",
    env="GPUTOP_STACKS",
    parse=kinds.not_off,
)
STACKS_HZ: Setting[float] = Setting(
    key="stacks_hz",
    meaning=f"stack samples a second at most ({STACKS_HZ_RANGE[0]:g}-{STACKS_HZ_RANGE[1]:g}), while a dashboard "
    "is connected; fewer where that would cost more than 0.1% of a core (on a small VM, whose wake-ups are dear, ~7)",
    default=20.0,
    kind="samples a second",
    env="GPUTOP_STACKS_HZ",
    parse=kinds.in_range(*STACKS_HZ_RANGE, "samples a second"),
    falls_back=True,
)
NODE_SAMPLER: Setting[str] = Setting(
    key="node_sampler",
    meaning="`auto`: local rank 0 starts its node's GPU sampler when the collector is on another machine; `off`, `on`",
    default="auto",
    kind="auto, on or off",
    env="GPUTOP_NODE_SAMPLER",
    parse=kinds.auto_on_off,
    falls_back=True,
)

# The node sampler (`gputop agent`, gputop.node).
NODE_HOSTNAME: Setting[str | None] = Setting(
    key="node_hostname",
    meaning="the host name a node sampler reports its GPUs under (a DaemonSet pod sets its node's)",
    default=None,
    default_text="this machine's name",
    kind="text",
    env="GPUTOP_NODE_HOSTNAME",
    parse=kinds.as_is,
    flags=("--hostname",),
)

# The dashboard and the other commands (gputop.cli).
NICE: Setting[int] = Setting(
    key="nice",
    meaning="how far the dashboard lowers its CPU priority, so the job's ranks get the CPU first "
    f"({NICE_RANGE[0]}: not at all; at most {NICE_RANGE[1]})",
    default=10,
    kind="whole number",
    env="GPUTOP_NICE",
    parse=kinds.clamped(*NICE_RANGE),
    falls_back=True,
)
REFRESH_S: Setting[float] = Setting(
    key="refresh_s",
    meaning="the dashboard redraws every S seconds (`--refresh` is remembered in the file)",
    default=0.5,
    kind="seconds",
    flags=("--refresh",),
    from_file=kinds.positive_number,
)
THEME: Setting[str] = Setting(
    key="theme",
    meaning="the dashboard's Textual theme (`--theme` and the theme picked in the app are remembered in the file)",
    default="textual-dark",
    kind="theme name",
    flags=("--theme",),
    from_file=kinds.name_in_quotes,
)
AUTO_CAPTURE: Setting[bool] = Setting(
    key="auto_capture",
    meaning="profile a straggler's or stall's culprit rank once its finding has held (`false`: never)",
    default=True,
    kind="true or false",
    flags=("--no-auto-capture",),
    from_file=kinds.true_or_false,
)
GPU_HOUR_PRICE: Setting[float | None] = Setting(
    key="gpu_hour_price",
    meaning="what a GPU-hour costs you: findings also say what their idle GPU-hours cost (every command)",
    default=None,
    default_text="none",
    kind="number",
    flags=("--gpu-hour-price",),
    from_file=kinds.positive_number,
)

SETTINGS: tuple[Setting[Any], ...] = (
    PORT, ADDR, SOCKET, TOKEN, TLS_CA, TLS_CERT, TLS_KEY,
    DISABLE, RUN_ID, WINDOW_S, DDP_SAMPLE_RATE, CUDA_EVENTS, TRACE_DIR, STACKS, STACKS_HZ, NODE_SAMPLER,
    NODE_HOSTNAME,
    NICE, REFRESH_S, THEME, AUTO_CAPTURE, GPU_HOUR_PRICE,
)  # fmt: skip

IN_FILE: tuple[Setting[Any], ...] = tuple(s for s in SETTINGS if s.from_file is not None)


def resolve(
    env: Mapping[str, str] = os.environ,
    *,
    flags: Mapping[str, object] | None = None,
    file: Mapping[str, object] | None = None,
) -> InForce:
    """The settings in force: ``flags`` as argparse gives them (None: not given), ``file`` the config file's table."""
    return InForce(tuple(setting.reading(env, flags, file) for setting in SETTINGS))
