"""The settings object: which source wins, what a bad value does, doctor's listing, the README's table."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import pytest

from gputop import settings
from gputop.address import Address, AddressError, resolve
from gputop.cli import parse_args
from gputop.doctor.in_force import check_settings
from gputop.model.figures import SPAN_S
from gputop.model.snapshot import SPAN_COPY_WINDOWS
from gputop.reporter import node_sampler, stacks
from gputop.settings import SettingError, config_file
from gputop.settings.setting import positive_number
from tests.support.processes import run_script

README = Path(__file__).resolve().parents[2] / "README.md"
TABLE_MARK = (
    "<!-- one row per entry of gputop/settings/__init__.py: tests/unit/test_settings.py prints the table when they "
    "differ -->"
)


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The config file of a user whose XDG_CONFIG_HOME is a fresh folder (the file not written yet)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    return tmp_path / "gputop" / "config.toml"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


class TestPrecedence:
    """A flag wins over the environment, which wins over the config file, which wins over the default."""

    def test_each_source_in_turn(self) -> None:
        everywhere = settings.Setting(key="x_s", meaning="", default=1.0, kind="seconds", env="GPUTOP_X_S",
                                      parse=float, flags=("--x",), from_file=positive_number)  # fmt: skip
        env, flags, file = {"GPUTOP_X_S": "2"}, {"x_s": 3.0}, {"x_s": 4.0}
        assert everywhere.reading(env, flags, file).value == 3.0
        assert everywhere.reading(env, {}, file).value == 2.0
        assert everywhere.reading({}, {}, file).value == 4.0
        assert everywhere.reading({}, {"x_s": None}, {}).value == 1.0  # argparse's None: the flag was not given
        each: tuple[tuple[Mapping[str, str], Mapping[str, object], Mapping[str, object]], ...]
        each = ((env, flags, file), (env, {}, file), ({}, {}, file), ({}, {}, {}))
        assert [everywhere.reading(*sources).source for sources in each] == ["flag", "env", "file", "default"]

    def test_a_commands_flag_beats_the_config_file(self, config: Path) -> None:
        assert parse_args(["report", "run.jsonl"]).gpu_hour_price is None
        write(config, "gpu_hour_price = 2.5\n")
        assert parse_args(["report", "run.jsonl"]).gpu_hour_price == 2.5
        args = parse_args(["report", "run.jsonl", "--gpu-hour-price", "3"])
        assert args.gpu_hour_price == 3.0 and args.in_force[settings.GPU_HOUR_PRICE].source == "flag"

    def test_the_off_switch_from_the_file_or_the_flag(self, config: Path) -> None:
        for argv in (["attach"], ["demo"], ["record", "--seconds", "1", "-o", "x.jsonl"]):
            assert parse_args(argv).auto_capture is True
            assert parse_args([*argv, "--no-auto-capture"]).auto_capture is False
        write(config, "auto_capture = false\n")
        assert parse_args(["attach"]).auto_capture is False

    def test_where_reporters_connect(self) -> None:
        env = {"GPUTOP_PORT": "29470", "GPUTOP_ADDR": "node-0:29471", "GPUTOP_SOCKET": "/tmp/x.sock"}
        assert resolve(29480, env=env) == Address(port=29480)  # --port
        assert resolve(env=env) == Address(port=29470)
        assert resolve(env={**env, "GPUTOP_PORT": ""}) == Address(host="node-0", port=29471)  # empty: unset
        assert resolve(env={"GPUTOP_SOCKET": "/tmp/x.sock"}) == Address(path=Path("/tmp/x.sock"))


class TestBadValues:
    """Each variable's rule for a value it cannot use, as users met it before the registry: kept."""

    def test_a_window_that_is_not_a_number_turns_reporting_off_in_one_line(self) -> None:
        code = 'import gputop\nassert gputop.watch() is None\nprint("trained")'
        result = run_script(code, None, GPUTOP_WINDOW_S="fast")
        assert result.returncode == 0 and result.stdout.strip() == "trained"
        said = "gputop: GPUTOP_WINDOW_S='fast' is not a number; reporting is off for this process"
        assert result.stderr.strip() == said

    @pytest.mark.parametrize("value", ["0", "-1", "0.1", "30"])
    def test_a_window_outside_what_the_figures_can_read_turns_reporting_off_in_one_line(self, value: str) -> None:
        """0 made the reporter thread send as fast as it could, beside the training; under 0.25 s a live view's
        windows no longer cover the figures' span, over 3 s a span never holds the 3 windows a share needs."""
        with pytest.raises(SettingError, match=rf"^GPUTOP_WINDOW_S='{value}' is not 0.25-3 seconds$"):
            settings.WINDOW_S.value({"GPUTOP_WINDOW_S": value})
        assert settings.WINDOW_S.value({"GPUTOP_WINDOW_S": "0.25"}) == 0.25

    def test_the_windows_bounds_follow_the_figures_span(self) -> None:
        shortest, longest = settings.WINDOW_S_RANGE
        assert shortest * SPAN_COPY_WINDOWS >= SPAN_S  # a live view's copy covers the span
        assert SPAN_S / longest >= 3  # and a span holds the windows a share's band needs

    def test_a_port_is_checked_where_it_is_read(self) -> None:
        with pytest.raises(AddressError, match=r"^GPUTOP_PORT='70000' is outside 1-65535$"):
            resolve(env={"GPUTOP_PORT": "70000"})
        with pytest.raises(AddressError, match=r"^GPUTOP_PORT='x' is not a port number$"):
            resolve(env={"GPUTOP_PORT": "x"})

    def test_the_ddp_rate_is_at_least_one(self) -> None:
        assert settings.DDP_SAMPLE_RATE.value({"GPUTOP_DDP_SAMPLE_RATE": "0"}) == 1
        assert settings.DDP_SAMPLE_RATE.value({}) is None  # the probe's own: DDP's on CUDA, 1 on the CPU
        with pytest.raises(settings.SettingError, match="GPUTOP_DDP_SAMPLE_RATE='ten' is not a whole number"):
            settings.DDP_SAMPLE_RATE.value({"GPUTOP_DDP_SAMPLE_RATE": "ten"})

    @pytest.mark.parametrize(
        ("text", "hz", "said"),
        [("0.5", 0.5, ""), ("200", 200.0, ""), ("500", 20.0, "GPUTOP_STACKS_HZ='500' is not 0.5-200 samples a "
         "second; 20 used"), ("nan", 20.0, "is not 0.5-200")],
    )  # fmt: skip
    def test_a_stack_rate_outside_its_range_is_the_default_said_once(self, text: str, hz: float, said: str) -> None:
        got, why = stacks.configured_hz({"GPUTOP_STACKS_HZ": text})
        assert got == hz and said in why and bool(why) == bool(said)

    def test_the_dashboards_priority_is_clamped_and_falls_back(self) -> None:
        assert [settings.NICE.value({"GPUTOP_NICE": t}) for t in ("99", "-5", "0", "x", "")] == [19, 0, 0, 10, 10]

    def test_switches_read_as_before(self) -> None:
        assert [node_sampler.mode({"GPUTOP_NODE_SAMPLER": t}) for t in (" On ", "NO", "maybe", "")] == [
            "on", "off", "auto", "auto"]  # fmt: skip
        assert [settings.STACKS.value({"GPUTOP_STACKS": t}) for t in ("Off", "no", "1", "")] == [0, 0, 1, 1]
        # GPUTOP_CUDA_EVENTS: only 0 turns them off; GPUTOP_DISABLE: anything but 0 turns gputop off.
        assert [settings.CUDA_EVENTS.value({"GPUTOP_CUDA_EVENTS": t}) for t in ("0", "false")] == [False, True]
        assert [settings.DISABLE.value({"GPUTOP_DISABLE": t}) for t in ("0", "no", "")] == [False, True, False]

    def test_a_bad_key_in_the_config_file_is_its_default_and_a_broken_file_is_ignored(
        self, config: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        write(config, 'refresh_s = -1\ntheme = 3\ngpu_hour_price = true\nauto_capture = "no"\n')
        args = parse_args(["attach"])
        assert (args.refresh_s, args.theme, args.gpu_hour_price, args.auto_capture) == (0.5, "textual-dark", None, True)
        assert args.in_force[settings.REFRESH_S].problem == (
            "refresh_s = -1 in the config file is not a number greater than 0; 0.5 used"
        )
        write(config, "refresh_s = = 1\n")
        assert parse_args(["attach"]).refresh_s == 0.5
        assert capsys.readouterr().err.startswith(f"gputop: ignoring {config}: ")


class TestConfigFile:
    """What the dashboard remembers comes back, and a rewrite keeps the keys written by hand."""

    def test_remembered_values_come_back_with_the_others_kept(self, config: Path) -> None:
        write(config, "auto_capture = false\ngpu_hour_price = 2.5\n")
        config_file.remember({"refresh_s": 2.0, "theme": "textual-light"})
        assert config_file.load() == {"refresh_s": 2.0, "theme": "textual-light", "auto_capture": False,
                                      "gpu_hour_price": 2.5}  # fmt: skip
        written = config.stat().st_mtime_ns
        config_file.remember({"theme": "textual-light"})  # nothing changes: nothing written
        assert config.stat().st_mtime_ns == written

    def test_a_bad_value_is_not_written_back(self, config: Path) -> None:
        write(config, "refresh_s = -1\n")
        config_file.remember({"theme": "textual-light"})
        assert config_file.load() == {"theme": "textual-light"}


class TestDoctorListing:
    """`gputop doctor`'s settings line: every setting, its source and value; a secret only as set."""

    def test_every_setting_with_its_source(self, tmp_path: Path) -> None:
        path = write(tmp_path / "config.toml", "gpu_hour_price = 2.5\n")
        check = check_settings({"GPUTOP_PORT": "29470", "GPUTOP_TOKEN": "hunter2"}, path)
        assert check.status == "ok"
        assert check.summary.startswith("3 of 22 set here (GPUTOP_PORT, GPUTOP_TOKEN, gpu_hour_price)")
        lines = {line.split()[0]: line.split(None, 2)[1:] for line in check.details}
        assert set(lines) == {s.name for s in settings.SETTINGS}
        assert lines["GPUTOP_PORT"] == ["env", "29470"]
        assert lines["GPUTOP_TOKEN"] == ["env", "set"]
        assert lines["gpu_hour_price"] == ["file", "2.5"]
        assert lines["GPUTOP_WINDOW_S"] == ["default", "1"]
        assert "hunter2" not in repr(check)

    def test_a_value_that_stops_reporting_is_a_problem_one_passed_over_a_note(self, tmp_path: Path) -> None:
        missing = tmp_path / "none.toml"
        check = check_settings({"GPUTOP_WINDOW_S": "fast"}, missing)
        assert check.status == "problem"
        assert check.summary == "GPUTOP_WINDOW_S='fast' is not a number; training started with it reports nothing"
        assert check_settings({"GPUTOP_STACKS_HZ": "500"}, missing).status == "note"
        broken = write(tmp_path / "broken.toml", "theme = \n")
        assert check_settings({}, broken).summary.startswith(f"ignoring {broken}: ")


def readme_table() -> list[str]:
    """The README's settings table as the registry writes it."""
    rows = ["| setting | value | default | flag | effect |", "|---|---|---|---|---|"]
    for s in settings.SETTINGS:
        name = f"`{s.env}`" if s.env else f"`{s.key}` in the config file"
        flags = ", ".join(f"`{flag}`" for flag in s.flags)
        default = s.show(s.default).replace("<", "\\<")  # <tmp> is no HTML tag
        rows.append(f"| {name} | {s.kind} | {default} | {flags} | {s.meaning} |")
    return rows


def test_the_readmes_table_is_the_registrys() -> None:
    lines = README.read_text().splitlines()
    assert TABLE_MARK in lines, f"README.md lacks the line {TABLE_MARK}"
    start = lines.index(TABLE_MARK) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    expected = readme_table()
    said = "README.md's settings table differs from gputop.settings; it should read:\n" + "\n".join(expected)
    assert lines[start:end] == expected, said


def test_every_gputop_variable_the_package_names_is_a_setting_or_said_not_to_be() -> None:
    """A variable read somewhere but missing from the registry fails here, before the README check can see it."""
    package = Path(settings.__file__).parents[1]
    named = {m for path in package.rglob("*.py") for m in re.findall(r"\bGPUTOP_[A-Z_]+\b", path.read_text())}
    registered = {s.env for s in settings.SETTINGS if s.env}
    assert named - registered == {"GPUTOP_DEMO_PID"}  # gputop demo's own, named in the registry's docstring
    assert "GPUTOP_DEMO_PID" in (settings.__doc__ or "")
