"""The ``gputop`` command: attach (default), record, report, replay, capture, agent, demo.

Errors a user can meet print one line (``gputop: ...``) and exit 1; usage
errors exit 2 (argparse).  Tracebacks are for bugs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gputop import __version__
from gputop.address import Address, AddressError, resolve
from gputop.install_check import other_gputop

if TYPE_CHECKING:
    from gputop.recording import Recorder

EXIT_ERROR = 1
ALERT_CHECK_S = 1.0  # how often `record --on-finding` diagnoses: the dashboard refreshes twice as often


class UserError(Exception):
    """Something the user can fix; printed as one line."""


class UsageError(UserError):
    """A combination of options that cannot work; one line, exit 2 like argparse's."""


EXIT_USAGE = 2


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be greater than 0")
    return value


def _theme(text: str) -> str:
    from textual.theme import BUILTIN_THEMES

    if text not in BUILTIN_THEMES:
        raise argparse.ArgumentTypeError(f"unknown theme {text!r}; one of: {', '.join(BUILTIN_THEMES)}")
    return text


def _add_address(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--port", type=int, help="listen on TCP 127.0.0.1:PORT (runs started with GPUTOP_PORT=PORT)")
    group.add_argument("--socket", metavar="PATH", help="listen on this Unix socket instead of the per-user default")
    group.add_argument(
        "--listen",
        metavar="ADDR:PORT",
        help="listen on TCP ADDR:PORT for ranks on other hosts (GPUTOP_ADDR=HOST:PORT); off loopback it needs "
        "GPUTOP_TOKEN; GPUTOP_TLS_CERT/GPUTOP_TLS_KEY add TLS",
    )


def _add_prometheus(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prometheus",
        metavar="[ADDR]:PORT",
        help="also serve Prometheus metrics on ADDR:PORT (:9464 = every interface); see docs/prometheus.md",
    )


def _start_prometheus(args: argparse.Namespace, source: Any) -> Any:
    """The Prometheus endpoint over the source's snapshots, started; None when not asked for."""
    if not args.prometheus:
        return None
    from gputop.address import parse_host_port
    from gputop.export.prometheus import ExporterError, PrometheusExporter

    where = parse_host_port(args.prometheus, "--prometheus")
    assert where.port is not None
    exporter = PrometheusExporter(source.snapshot, where.host, where.port)
    try:
        exporter.start()
    except ExporterError as exc:
        raise UserError(str(exc)) from None
    return exporter


def _listen_address(args: argparse.Namespace) -> Address:
    """Where to listen; a network-facing listener without a token is a usage error."""
    from gputop.auth import Security, is_loopback

    address = resolve(args.port, args.socket, listen=args.listen)
    if address.is_tcp and not is_loopback(address.host) and not Security.from_env().token:
        raise UsageError(
            f"--listen {address.host}:{address.port} is reachable from the network: "
            "set GPUTOP_TOKEN (the same value in every rank's environment)"
        )
    return address


def _add_dashboard_options(parser: argparse.ArgumentParser) -> None:
    _add_alert_after(parser)
    parser.add_argument(
        "--refresh", type=_positive, default=None, metavar="S", help="redraw every S seconds (default 0.5; remembered)"
    )
    parser.add_argument("--theme", type=_theme, default=None, help="a Textual theme, e.g. textual-light (remembered)")
    parser.add_argument(
        "--interval", type=_positive, default=1.0, metavar="S", help="sample GPUs and host every S seconds (default 1)"
    )


def _add_alert_after(parser: argparse.ArgumentParser) -> None:
    from gputop.diagnose.alerts import HOLD_S

    parser.add_argument(
        "--alert-after",
        type=_non_negative,
        default=HOLD_S,
        metavar="S",
        help=f"a warn/critical finding alerts once it has held S seconds (default {HOLD_S:g})",
    )


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must not be negative")
    return value


def _ranks(text: str) -> list[int]:
    try:
        ranks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rank or a comma-separated list of ranks") from None
    if not ranks or any(r < 0 for r in ranks):
        raise argparse.ArgumentTypeError(f"{text!r}: ranks are numbers from 0")
    return list(dict.fromkeys(ranks))


def _capture_steps(text: str) -> int:
    from gputop.protocol import MAX_CAPTURE_STEPS

    try:
        steps = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= steps <= MAX_CAPTURE_STEPS:
        raise argparse.ArgumentTypeError(f"--steps must be from 1 to {MAX_CAPTURE_STEPS}")
    return steps


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gputop",
        description="See why your GPUs sit idle: a live, rank-aware dashboard for PyTorch training.",
    )
    parser.add_argument("--version", action="version", version=f"gputop {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    attach = commands.add_parser("attach", help="open the dashboard (the default command)")
    _add_address(attach)
    _add_prometheus(attach)
    _add_dashboard_options(attach)

    record = commands.add_parser("record", help="record reporters, GPU and host samples to a JSON-lines file")
    _add_address(record)
    record.add_argument("--seconds", type=_positive, required=True, help="stop after S seconds")
    record.add_argument(
        "-o", "--output", type=Path, required=True,
        help="the recording to write: run.jsonl, or run.jsonl.gz compressed (stays readable if killed)",
    )  # fmt: skip
    record.add_argument(
        "--merge-after", type=float, default=900.0, metavar="S",
        help="from S seconds on, merge each rank's windows into --merge-s ones (default 900; -1: never)",
    )  # fmt: skip
    record.add_argument(
        "--merge-s", type=_positive, default=10.0, metavar="S", help="merged window length (default 10)"
    )
    record.add_argument("--interval", type=_positive, default=1.0, metavar="S", help="GPU/host sampling period")
    record.add_argument(
        "--on-finding",
        metavar="CMD",
        help="run CMD (through the shell) with a warn/critical finding as JSON on stdin: once when it has held "
        "--alert-after seconds, again when it worsens or clears",
    )
    _add_alert_after(record)
    _add_prometheus(record)

    capture = commands.add_parser(
        "capture",
        help="profile ranks' next steps with torch.profiler, asked of the dashboard or recorder listening there",
    )
    _add_address(capture)
    capture.add_argument("--rank", type=_ranks, required=True, help="the rank, or several: 0,1,3 (side by side)")
    capture.add_argument("--steps", type=_capture_steps, default=5, help="steps to profile (default 5, at most 1000)")
    capture.add_argument("--run", default="", metavar="RUN_ID", help="the run (default: the newest with that rank)")
    capture.add_argument("--timeout", type=_positive, default=120.0, metavar="S", help="wait at most S seconds")
    capture.add_argument("--format", choices=("text", "json"), default="text")

    agent = commands.add_parser(
        "agent",
        help="send this host's GPU readings to a dashboard or recorder on another machine "
        "(local rank 0 starts one by itself; this is for a DaemonSet or a Slurm prolog)",
    )
    agent.add_argument(
        "--addr", metavar="HOST:PORT", default=None,
        help="the collector (default: GPUTOP_ADDR, GPUTOP_PORT or the local socket, as reporters resolve it)",
    )  # fmt: skip
    agent.add_argument("--interval", type=_positive, default=1.0, metavar="S", help="seconds between samples")
    agent.add_argument(
        "--hostname", default=None,
        help="the host name this node's ranks report (default: this machine's; a DaemonSet pod passes its node's)",
    )  # fmt: skip

    report = commands.add_parser("report", help="summarise a recording: per rank, per GPU, findings")
    report.add_argument("recording", type=Path)
    report.add_argument("--format", choices=("text", "json", "markdown"), default="text")

    replay = commands.add_parser("replay", help="show a recording in the dashboard")
    replay.add_argument("recording", type=Path)
    replay.add_argument("--speed", type=_positive, default=1.0, help="playback speed (default 1)")
    replay.add_argument("--refresh", type=_positive, default=None, metavar="S", help="redraw every S seconds")
    replay.add_argument("--theme", type=_theme, default=None, help="a Textual theme, e.g. textual-light (remembered)")

    demo = commands.add_parser("demo", help="run a bundled 2-rank CPU DDP job and watch it")
    from gputop.demos.scenarios import SCENARIO_NAMES

    demo.add_argument("--scenario", choices=SCENARIO_NAMES, default="healthy")
    demo.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    demo.add_argument("--headless", action="store_true", help="no dashboard: print a report at the end")
    demo.add_argument("--seconds", type=_positive, default=None, help="run for S seconds (headless default 15)")
    demo.add_argument("--format", choices=("text", "json", "markdown"), default="text", help="headless report format")
    demo.add_argument("--record", type=Path, default=None, help="also record the run to this file")
    _add_dashboard_options(demo)

    doctor = commands.add_parser(
        "doctor",
        help="say what gputop can see on this machine (NVML, GPUs, torch, sockets, settings) and why not",
        description="Check NVML and the driver, the GPUs, the container, torch, the per-user socket, the "
        "collector GPUTOP_ADDR/GPUTOP_PORT/GPUTOP_SOCKET name, and the token and TLS settings: one line each, "
        "marked ok, -- (worth knowing) or !! (not ok: why, and what to do).",
        epilog="exit status: 0 when NVML answers with at least one GPU (a dashboard here would see GPUs), 1 otherwise",
    )
    doctor.add_argument("--format", choices=("text", "json"), default="text", help="json: for a bug report")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if (collision := other_gputop()) is not None:  # the unrelated PyPI 'gputop' shares our files (docs/packaging.md)
        print(f"gputop: {collision}", file=sys.stderr)
    args = build_parser().parse_args(argv)
    command = args.command or "attach"
    if args.command is None:  # `gputop` alone: attach with the defaults
        args = build_parser().parse_args(["attach", *(argv if argv is not None else sys.argv[1:])])
    handler = {"attach": cmd_attach, "record": cmd_record, "report": cmd_report, "replay": cmd_replay,
               "capture": cmd_capture, "agent": cmd_agent, "doctor": cmd_doctor,
               "demo": cmd_demo}[command]  # fmt: skip
    try:
        return handler(args)
    except UsageError as exc:
        print(f"gputop: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (UserError, AddressError) as exc:
        print(f"gputop: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


def cmd_agent(args: argparse.Namespace) -> int:
    """The node sampler, started by hand: this host's GPUs to a collector elsewhere (gputop.node)."""
    from gputop.node.sampler import main as agent_main

    argv = ["--interval", str(args.interval)]
    if args.addr:
        argv += ["--addr", args.addr]
    if args.hostname:
        argv += ["--hostname", args.hostname]
    return agent_main(argv)


def cmd_doctor(args: argparse.Namespace) -> int:
    """What gputop can see on this machine, and why not (gputop.doctor)."""
    from gputop.doctor import run

    return run(args.format)


# -- the dashboard -----------------------------------------------------------------


def _run_dashboard(source: Any, args: argparse.Namespace, notice: str | None = None) -> int:
    """Show a started source until the user quits; the caller owns the source's start and stop.

    ``--refresh`` and ``--theme`` given here are remembered (gputop.tui.settings) for the next start.
    """
    from textual.theme import BUILTIN_THEMES

    from gputop.diagnose import Diagnoser
    from gputop.tui import settings
    from gputop.tui.app import run_dashboard

    saved = settings.load()
    theme = getattr(args, "theme", None)  # checked by the parser
    if saved.theme not in BUILTIN_THEMES:
        saved = settings.Settings(refresh_s=saved.refresh_s)
    chosen = settings.Settings(refresh_s=args.refresh or saved.refresh_s, theme=theme or saved.theme)
    if chosen != saved:
        settings.save(chosen)

    def remember_theme(name: str) -> None:
        if name != (chosen.theme or settings.DEFAULT_THEME):
            settings.save(settings.Settings(refresh_s=chosen.refresh_s, theme=name))

    # The UI shows rejected connections itself; log lines would corrupt the screen.
    logging.getLogger("gputop").addHandler(logging.NullHandler())
    logging.getLogger("gputop").propagate = False
    from gputop.diagnose.alerts import HOLD_S, AlertTracker

    alert_after_s = getattr(args, "alert_after", None)
    alerts = AlertTracker(hold_s=HOLD_S if alert_after_s is None else alert_after_s)
    return run_dashboard(
        source,
        refresh_s=chosen.refresh_s or settings.DEFAULT_REFRESH_S,
        diagnoser_factory=Diagnoser,
        theme=chosen.theme or settings.DEFAULT_THEME,
        remember_theme=remember_theme,
        alerts=alerts,
        notice=notice,
    )


def cmd_attach(args: argparse.Namespace) -> int:
    from gputop.collect.live import LiveSource
    from gputop.yielding import yield_to_training

    # Before any thread starts, so every one inherits it; not in `gputop demo`, whose ranks are
    # its children and would inherit it too.
    yield_to_training()
    source = LiveSource(_listen_address(args), sample_interval_s=args.interval)
    source.start()
    exporter = None
    try:
        exporter = _start_prometheus(args, source)
        return _run_dashboard(source, args)
    finally:
        if exporter is not None:
            exporter.stop()
        source.stop()


def cmd_replay(args: argparse.Namespace) -> int:
    from gputop.collect.replay import ReplaySource
    from gputop.recording import RecordingError

    try:
        source = ReplaySource(args.recording, speed=args.speed)
    except RecordingError as exc:
        raise UserError(str(exc)) from None
    source.start()
    try:
        return _run_dashboard(source, args)
    finally:
        source.stop()


# -- headless ----------------------------------------------------------------------


def _log_to_stderr() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("gputop: %(message)s"))
    logger = logging.getLogger("gputop")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def _open_recorder(path: Path, *, source: str, merge_after_s: float | None = None, merge_s: float = 10.0) -> Recorder:
    from gputop.recording import Recorder, RecordingError

    try:
        return Recorder(path, source=source, merge_after_s=merge_after_s, merge_s=merge_s)
    except RecordingError as exc:
        raise UserError(str(exc)) from None


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """Within: SIGTERM stops like Ctrl-C, so the recording is closed whole.

    What a scheduler, ``kill`` or a container's stop sends is SIGTERM, and Python
    dies of it on the spot: the merged windows not yet written and, in a ``.gz``
    recording, the last seconds and the stream's end were lost, and the summary
    never said what was written. (A shell's background job also ignores SIGINT.)
    """

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def cmd_record(args: argparse.Namespace) -> int:
    from gputop.collect.live import LiveSource

    _log_to_stderr()
    address = _listen_address(args)
    merge_after_s = args.merge_after if args.merge_after >= 0 else None
    recorder = _open_recorder(args.output, source=str(address), merge_after_s=merge_after_s, merge_s=args.merge_s)
    source = LiveSource(address, sample_interval_s=args.interval, recorder=recorder)
    exporter = None
    try:
        source.start()
        exporter = _start_prometheus(args, source)
        metrics = f", Prometheus metrics on :{exporter.port}/metrics" if exporter is not None else ""
        with contextlib.suppress(KeyboardInterrupt), _sigterm_interrupts():
            # Said once SIGTERM stops it cleanly: a script may wait for this line, then signal.
            print(f"gputop: recording {address} to {args.output} for {args.seconds:g} s{metrics}", file=sys.stderr)
            if args.on_finding:
                _record_with_alerts(source, args.seconds, args.on_finding, args.alert_after)
            else:
                time.sleep(args.seconds)
    finally:
        if exporter is not None:
            exporter.stop()
        source.stop()
        recorder.close()
    snapshot = source.snapshot()
    ranks = snapshot.all_ranks()
    hosts = len({r.hello.hostname for r in ranks})
    print(
        f"gputop: wrote {recorder.lines} lines from {len(ranks)} rank(s) on {hosts} host(s) to {args.output}",
        file=sys.stderr,
    )
    if snapshot.node_gpu_history:  # nodes' samplers sent their GPUs: say whose, so a missing node shows
        names = list(snapshot.node_gpu_history)
        nodes = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        print(f"gputop: GPUs of {len(snapshot.node_gpu_history)} other host(s): {nodes}", file=sys.stderr)
    if snapshot.token_refusals:
        print(f"gputop: refused {snapshot.token_refusals} connection(s) for a wrong or missing token", file=sys.stderr)
    return 0


def _record_with_alerts(source: Any, seconds: float, command: str, hold_s: float) -> None:
    """Diagnose once a second while recording and run ``command`` for each alert."""
    from gputop.alert_command import AlertCommand
    from gputop.diagnose import Diagnoser
    from gputop.diagnose.alerts import AlertTracker
    from gputop.diagnose.live import LivePipeline

    pipeline = LivePipeline(diagnoser=Diagnoser(), alerts=AlertTracker(hold_s=hold_s))
    runner = AlertCommand(command)
    end_s = time.monotonic() + seconds
    said = "ok"
    try:
        while (left_s := end_s - time.monotonic()) > 0:
            time.sleep(min(ALERT_CHECK_S, left_s))
            update = pipeline.update(source.snapshot())
            if update.diagnosis != said:  # a rule that raised: said once, not every second
                said = update.diagnosis
                print(f"gputop: diagnosis {said}", file=sys.stderr)
            for run_id, briefs in update.to_ranks.items():
                source.notify_findings(run_id, briefs)  # the ranks log them beside their loss
            for alert in update.alerts:
                print(f"gputop: {alert.kind}: {alert.finding.title}", file=sys.stderr)
                runner.run(alert)
            runner.reap()
    finally:
        runner.wait()


def cmd_capture(args: argparse.Namespace) -> int:
    """Ask the collector at the address to have each rank profile its next steps; print them side by side."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    import msgspec

    from gputop.collect.capture_relay import ask
    from gputop.model.captures import render
    from gputop.protocol import CaptureRequest, ProtocolError

    address = resolve(args.port, args.socket)
    tag = f"{int(time.time())}-{os.getpid()}"
    requests = [
        CaptureRequest(run_id=args.run, rank=rank, id=f"cli-{tag}-r{rank}", steps=args.steps, timeout_s=args.timeout)
        for rank in args.rank
    ]
    print(f"gputop: capturing {args.steps} steps on rank(s) {', '.join(map(str, args.rank))} via {address}",
          file=sys.stderr)  # fmt: skip
    try:
        # All at once: the ranks profile the same steps, which is what makes them comparable.
        with ThreadPoolExecutor(max_workers=len(requests)) as pool:
            results = list(pool.map(lambda request: ask(address, request), requests))
    except (ConnectionRefusedError, FileNotFoundError):
        raise UserError(f"nothing listens on {address}: start `gputop` or `gputop record` there first") from None
    except (OSError, ProtocolError) as exc:
        raise UserError(f"capture via {address} failed: {exc}") from None
    if args.format == "json":
        print(json.dumps([msgspec.to_builtins(r) for r in results], indent=2))
    else:
        print("\n".join(render(results)))
    return 0 if all(r.ok for r in results) else EXIT_ERROR


def cmd_report(args: argparse.Namespace) -> int:
    from gputop import recording, report

    stats = recording.ReadStats()
    try:
        store, last_t = recording.load(args.recording, stats)
    except recording.RecordingError as exc:
        raise UserError(str(exc)) from None
    notes = []
    if stats.skipped:
        notes.append(
            f"skipped {stats.skipped} damaged line(s) of {stats.lines} (first at {stats.first_skipped}); "
            "a recorder killed mid-write leaves one"
        )
    sys.stdout.write(report.render(store.snapshot(last_t, history=None), args.format, notes))
    return 0


# -- demo --------------------------------------------------------------------------


# Runs torchrun with "SIGTERM me when my parent dies" set (Linux; elsewhere it just
# runs it). The job has a session of its own, so Ctrl-C in the dashboard is ours
# to handle, which also means a closed terminal's SIGHUP never reaches it: when
# tmux or SSH goes away and gputop dies, torchrun would train on, orphaned. It
# stops its ranks on SIGTERM (and each rank also leaves when we have: a SIGTERM
# that lands while torchrun starts them loses them; see gputop/demos/teardown.py).
# Set in a fresh interpreter that then execs, because a preexec_fn in a process
# with threads (ours has the collector's) can deadlock.
_EXEC_WITH_PDEATHSIG = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG, kept across exec
except Exception:
    pass
os.execv(sys.argv[1], sys.argv[1:])
"""


class DemoJob:
    """The bundled training job under torchrun, in its own process group so it is always cleaned up."""

    def __init__(self, *, scenario: str, nproc: int, port: int, seconds: float | None, log_path: Path) -> None:
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "gputop.demos.train", "--scenario", scenario,
        ]  # fmt: skip
        if seconds:
            cmd += ["--seconds", str(seconds)]
        from gputop.demos.teardown import DEMO_PID_ENV

        env = {**os.environ, "GPUTOP_PORT": str(port), "PYTHONUNBUFFERED": "1", DEMO_PID_ENV: str(os.getpid())}
        env.pop("GPUTOP_SOCKET", None)
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _EXEC_WITH_PDEATHSIG, *cmd],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, rank_pids: Sequence[int] = ()) -> None:
        """SIGINT torchrun (it stops its ranks), then SIGTERM, SIGKILL; then any rank left behind.

        torchrun starts each rank in a session of its own, so killing
        torchrun's process group alone can orphan ranks: they are found first.
        """
        ranks = self._descendants() + self._demo_processes(rank_pids)
        if self.proc.poll() is None:
            for sig, grace_s in ((signal.SIGINT, 3.0), (signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, sig)
                if self.wait(grace_s) is not None:
                    break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for rank in ranks:  # orphaned by a launcher that did not get to stop them
            with contextlib.suppress(Exception):
                rank.kill()
        self._log.close()

    @staticmethod
    def _demo_processes(pids: Sequence[int]) -> list[Any]:
        """The given pids that are still demo ranks (a pid reused by another program is left alone)."""
        import psutil

        found = []
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if "gputop.demos.train" in " ".join(proc.cmdline()):
                    found.append(proc)
        return found

    def _descendants(self) -> list[Any]:
        import psutil

        try:
            return list(psutil.Process(self.proc.pid).children(recursive=True))
        except psutil.Error:
            return []

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


def cmd_demo(args: argparse.Namespace) -> int:
    from gputop import report
    from gputop.collect.live import LiveSource
    from gputop.demos.scenarios import plan, usable_cores

    if importlib.util.find_spec("torch") is None:
        raise UserError("`gputop demo` runs a real PyTorch job and needs torch: pip install 'gputop-train[torch]'")
    if args.nproc < 1:
        raise UserError("--nproc must be at least 1")
    seconds = args.seconds if args.seconds is not None else (15.0 if args.headless else None)
    planned = plan(args.scenario, cores=usable_cores(), nproc=args.nproc)
    recorder = _open_recorder(args.record, source="demo") if args.record is not None else None
    source = LiveSource(Address(port=0), sample_interval_s=args.interval, recorder=recorder)
    job: DemoJob | None = None
    keep_log = False
    try:
        source.start()
        port = source.address.port
        assert port is not None
        log_file = tempfile.NamedTemporaryFile(prefix="gputop-demo-", suffix=".log", delete=False)  # noqa: SIM115
        log_file.close()
        job = DemoJob(
            scenario=args.scenario, nproc=args.nproc, port=port, seconds=seconds, log_path=Path(log_file.name)
        )
        if not args.headless:
            ui_code = _run_dashboard(source, args, notice=planned)
            keep_log = job.proc.poll() not in (None, 0)  # the job failed while watched
            if keep_log:
                print(f"gputop: the demo job exited with code {job.proc.returncode}; its log: {job.log_path}")
            return ui_code
        _log_to_stderr()
        assert seconds is not None  # headless runs always have a length
        print(f"gputop: {planned}, {seconds:g} s", file=sys.stderr)
        # torch's import and the process group's start take a few seconds before the timed part.
        code = job.wait(seconds + 90.0)
        keep_log = True
        if code is None:
            raise UserError(f"the demo job did not finish in {seconds + 90:.0f} s; its log: {job.log_path}")
        time.sleep(0.3)  # the ranks' last windows are sent at exit; let the collector take them in
        snapshot = source.store.snapshot(time.time(), history=None)
        if code != 0 or not snapshot.runs:
            why = f"exited with code {code}" if code != 0 else "ran but nothing reported"
            raise UserError(f"the demo job {why}; last lines of {job.log_path}:\n{job.log_tail()}")
        keep_log = False
        sys.stdout.write(report.render(snapshot, args.format))
        return 0
    finally:
        if job is not None:
            # Ranks reported their pids: stop those too, in case torchrun died before it could.
            job.stop(rank_pids=source.store.rank_pids(include_finished=True, hostname=socket.gethostname()))
            if not keep_log:
                with contextlib.suppress(OSError):
                    job.log_path.unlink()
        source.stop()
        if recorder is not None:
            recorder.close()
