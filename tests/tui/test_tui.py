"""The dashboard's behaviour, driven through Textual's pilot with fixed data."""

from __future__ import annotations

import re

import pytest
from textual.binding import Binding

from gputop.diagnose.findings import Evidence, Finding
from gputop.model.snapshot import Snapshot
from gputop.model.source import FixedSource
from gputop.tui.app import GputopApp
from gputop.tui.screens.detail import RankDetailScreen
from gputop.tui.screens.help import HelpScreen
from gputop.tui.widgets.findings import FindingsPanel
from gputop.tui.widgets.gpu_panel import GpuPanel
from gputop.tui.widgets.header import HeaderBar
from gputop.tui.widgets.ranks_table import RanksTable
from tests.support import tui_fixtures as fx
from tests.support.pilot import FAST_S, FakeDiagnoser, shown, table_text

LOADER = Finding(
    cause="data_loading",
    severity="warn",
    title="rank 1 waits for data 42% of each step",
    suggestion="DataLoader(num_workers=8, pin_memory=True, persistent_workers=True)",
    evidence=(Evidence("loader_wait_pct", 42.0, 5.0, "%", rank=1),),
    ranks=(1,),
)
STRAGGLER = Finding(cause="straggler", severity="critical", title="rank 5 holds the others back", suggestion="x")


class TestData:
    """Data reaches the widgets through the worker, and changes show up."""

    async def test_ranks_appear(self) -> None:
        source = FixedSource(fx.two_ranks())
        async with GputopApp(source, refresh_s=FAST_S).run_test(size=(120, 40)) as pilot:
            app = await shown(pilot)
            rows = table_text(app)
            assert [r[0].strip(" ▲") for r in rows] == ["0", "1"]

    async def test_a_rank_appearing_later(self) -> None:
        source = FixedSource(fx.empty())
        async with GputopApp(source, refresh_s=FAST_S).run_test(size=(80, 24)) as pilot:
            app = await shown(pilot)
            assert app.query_one("#empty").display
            assert app.query_one(RanksTable).row_count == 0
            snapshot = fx.two_ranks()
            source.set(snapshot)
            await shown(pilot, snapshot)
            assert app.query_one(RanksTable).row_count == 2
            assert not app.query_one("#empty").display

    async def test_a_rank_going_lost(self) -> None:
        source = FixedSource(fx.two_ranks())
        async with GputopApp(source, refresh_s=FAST_S).run_test(size=(80, 24)) as pilot:
            app = await shown(pilot)
            assert [r[-1] for r in table_text(app)] == ["live", "live"]
            snapshot = fx.lost_rank()
            source.set(snapshot)
            await shown(pilot, snapshot)
            assert [r[-1] for r in table_text(app)] == ["live", "lost"]
            assert "1 not live" in app.query_one(HeaderBar).text

    async def test_gputop_shows_what_it_costs_the_ranks(self) -> None:
        """The header and the rank's detail screen quote the reporter's self-accounting (issue: no peer does)."""
        async with GputopApp(FixedSource(fx.self_accounting()), refresh_s=FAST_S).run_test(size=(120, 40)) as pilot:
            app = await shown(pilot)
            # 1.1 ms of gputop per 0.5-s window of a rank at 100% CPU; 0.1 ms of hooks over 10 steps.
            assert "gputop 0.22% CPU · 10µs/step" in app.query_one(HeaderBar).text
            await pilot.press("enter")
            await pilot.pause()
            detail = app.screen
            assert isinstance(detail, RankDetailScreen)
            stats_text = str(detail.query_one("#detail-stats").render())
            assert "gputop's own cost 0.22% of this rank's CPU: reporter thread 0.20% of a core" in stats_text
            assert "10µs per step in its hooks" in stats_text

    async def test_sixty_four_ranks_render_and_refresh_keeps_up(self) -> None:
        """64 ranks on 8 hosts start folded under 8 host rows; f opens all 64; new snapshots keep coming."""
        source = FixedSource(fx.big_run())
        async with GputopApp(source, refresh_s=FAST_S).run_test(size=(160, 48)) as pilot:
            app = await shown(pilot)
            table = app.query_one(RanksTable)
            assert [r[0] for r in table_text(app)] == [f"▸ node-{n}" for n in range(8)]
            assert "64/64 ranks" in app.query_one(HeaderBar).text
            assert "8 hosts" in app.query_one(HeaderBar).text
            await pilot.press("f")
            await pilot.pause()
            assert table.row_count == 8 + 64
            ranks = [int(r[0].strip(" ▲")) for r in table_text(app) if "node" not in r[0]]
            assert sorted(ranks) == list(range(64))
            for n_windows in (21, 22, 23):
                snapshot = fx.big_run(n_windows=n_windows)
                source.set(snapshot)
                await shown(pilot, snapshot)
                assert table.row_count == 8 + 64

    async def test_enter_on_a_host_folds_and_unfolds_it(self) -> None:
        """Enter on a host's summary row opens its ranks under it, and enter again folds them."""
        async with GputopApp(FixedSource(fx.big_run()), refresh_s=FAST_S).run_test(size=(160, 48)) as pilot:
            app = await shown(pilot)
            table = app.query_one(RanksTable)
            await pilot.press("down", "enter")  # node-1
            await pilot.pause()
            rows = table_text(app)
            assert rows[1][0] == "▾ node-1"
            assert [r[0].strip(" ▲") for r in rows[2:10]] == [str(n) for n in range(8, 16)]
            assert rows[10][0] == "▸ node-2"
            await pilot.press("enter")
            await pilot.pause()
            assert table.row_count == 8
            assert not isinstance(app.screen, RankDetailScreen)

    async def test_no_gpu_data_says_why(self) -> None:
        async with GputopApp(FixedSource(fx.no_gpu()), refresh_s=FAST_S).run_test(size=(80, 24)) as pilot:
            app = await shown(pilot)
            text = str(app.query_one(GpuPanel).render())
            assert text.startswith("no GPU data: NVML library not found")

    async def test_other_hosts_gpus_show_under_their_hosts_with_their_ranks(self) -> None:
        """A head node without GPUs: each node's GPUs (from its sampler) under its name, joined to its ranks."""
        async with GputopApp(FixedSource(fx.remote_gpus()), refresh_s=FAST_S).run_test(size=(160, 48)) as pilot:
            app = await shown(pilot)
            lines = str(app.query_one(GpuPanel).render()).splitlines()
            assert lines[0].startswith("this dashboard's host: no GPU data: NVML library not found")
            assert lines[1].startswith("node-a  4 GPUs") and lines[6].startswith("node-b  4 GPUs")
            assert "1 process not a rank's" in lines[6]
            assert [line.split()[0] for line in lines[2:6]] == ["0", "1", "2", "3"]  # indices repeat per host
            assert "r6" in lines[9] and "+pid 9999 jupyter" in lines[9]  # node-b's GPU 2: rank 6 and a stranger
            assert "8 GPUs" in app.query_one(HeaderBar).text
            # The run chart draws the GPUs of the selected rank's host (the first rank's: node-a).
            assert "GPUs of node-a" in str(app.main.chart.border_title)
            assert app.main.chart.gpu_history and app.main.chart.gpu_history[-1].hostname == "node-a"

    async def test_many_hosts_gpus_fold_to_a_line_each_when_they_do_not_fit(self) -> None:
        async with GputopApp(FixedSource(fx.remote_gpus()), refresh_s=FAST_S).run_test(size=(120, 20)) as pilot:
            app = await shown(pilot)
            lines = str(app.query_one(GpuPanel).render()).splitlines()
            folded = [line for line in lines if line.startswith("node-")]
            assert len(folded) == 2 and "4 ranks" in folded[0] and "1 not a rank's" in folded[1], lines

    async def test_na_is_never_zero(self) -> None:
        async with GputopApp(FixedSource(fx.no_gpu()), refresh_s=FAST_S).run_test(size=(120, 40)) as pilot:
            app = await shown(pilot)
            table = app.query_one(RanksTable)
            memory = table.get_column_index("mem")
            assert all(row[memory] == "N/A" for row in table_text(app))

    async def test_a_failing_source_keeps_the_last_view(self) -> None:
        class Broken(FixedSource):
            fail = False

            def snapshot(self) -> Snapshot:
                if self.fail:
                    raise OSError("collector gone")
                return super().snapshot()

        source = Broken(fx.two_ranks())
        async with GputopApp(source, refresh_s=FAST_S).run_test(size=(80, 24)) as pilot:
            app = await shown(pilot)
            source.fail = True
            await pilot.pause(FAST_S * 4)
            assert app.query_one(RanksTable).row_count == 2
            assert any("collector gone" in str(n.message) for n in app._notifications)


class TestHeader:
    """On a narrow screen the header gives way a whole piece at a time, and never drops the paused marker.

    Refreshed once a second: "figures every N s", which must stay, shows only when a pass
    of figures costs more than FIGURES_DUTY of 1.5 refreshes, and at 0.05 s a loaded
    machine gets there, which changes what fits.
    """

    async def test_pausing_at_eighty_columns_shows_the_marker(self) -> None:
        """At 80 columns a run's line fills the screen: the marker takes gputop's cost's place, not nothing."""
        async with GputopApp(FixedSource(fx.self_accounting()), refresh_s=1.0).run_test(size=(80, 24)) as pilot:
            app = await shown(pilot)
            header = app.query_one(HeaderBar)
            assert "gputop 0.22% CPU · 10µs/step" in header.text
            await pilot.press("p")
            await pilot.pause()
            text = header.text
            assert text.rstrip().endswith("⏸ PAUSED"), text
            assert "train.py  1/1 ranks  up 10s  20 steps/s" in text, text
            assert "CPU" not in text and "µs" not in text, f"gputop's cost was cut, not dropped whole: {text!r}"

    async def test_many_hosts_keep_the_ranks_and_drop_the_details(self) -> None:
        """64 ranks at 60 columns: the run, its ranks and steps/s stay; uptime and GPUs give way first."""
        async with GputopApp(FixedSource(fx.big_run()), refresh_s=1.0).run_test(size=(60, 24)) as pilot:
            app = await shown(pilot)
            text = app.query_one(HeaderBar).text
            assert re.search(r"llm_pretrain\.py(  8 hosts)?  64/64 ranks  8 steps/s", text), text
            assert "GPUs" not in text and "up " not in text, text


class TestLayout:
    """The screen goes where there is something to show: no blank table, the run chart takes the rest."""

    async def test_a_short_table_leaves_its_lines_to_the_run_chart(self) -> None:
        async with GputopApp(FixedSource(fx.two_ranks()), refresh_s=FAST_S).run_test(size=(120, 40)) as pilot:
            app = await shown(pilot)
            await pilot.pause(4 * FAST_S)  # the middle is fitted after the refresh that filled the table
            assert app.main.table.size.height == 3, "the table should be its header and 2 rows, not blank lines"
            chart = app.main.chart
            assert chart.size.height >= 20, f"the run chart got {chart.size.height} lines of a 40-line screen"
            # Taller than a line a series, the bars say where their scale tops out.
            assert "peak" in chart.text

    async def test_many_rows_scroll_in_the_table_and_the_chart_keeps_its_lines(self) -> None:
        async with GputopApp(FixedSource(fx.big_run()), refresh_s=FAST_S).run_test(size=(160, 48)) as pilot:
            app = await shown(pilot)
            await pilot.press("f")  # 8 hosts opened: 72 rows, more than the screen
            await pilot.pause(4 * FAST_S)
            table, chart = app.main.table, app.main.chart
            assert table.virtual_size.height == 73
            assert 5 < table.size.height < 48
            assert table.max_scroll_y > 0, "the rows past the screen should scroll"
            # Two series and 8 GPUs' lines: the chart is never squeezed below them.
            assert chart.size.height >= 2 + 8, f"the run chart got {chart.size.height} lines"


class TestKeys:
    """q, ?, p, s, enter, esc."""

    async def test_sort_cycles_and_keeps_runs_grouped(self) -> None:
        async with GputopApp(FixedSource(fx.two_runs()), refresh_s=FAST_S).run_test(size=(120, 40)) as pilot:
            app = await shown(pilot)
            table = app.query_one(RanksTable)
            assert table.sort_key.name == "rank"
            await pilot.press("s", "s")  # step p50, then loader wait
            assert table.sort_key.name == "loader wait"
            runs = [r[0] for r in table_text(app)]
            assert runs == ["train.py", "train.py", "finetune.py"]
            assert "sort: loader wait" in str(app.query_one("#ranks-box").border_title)

    async def test_sort_by_loader_puts_the_waiting_rank_first(self) -> None:
        async with GputopApp(FixedSource(fx.two_ranks()), refresh_s=FAST_S).run_test(size=(80, 24)) as pilot:
            app = await shown(pilot)
            await pilot.press("s", "s")
            assert table_text(app)[0][0].strip(" ▲") == "1"

    async def test_pause_freezes_the_view(self) -> None:
        source = FixedSource(fx.empty())
        async with GputopApp(source, refresh_s=FAST_S).run_test(size=(80, 24)) as pilot:
            app = await shown(pilot)
            await pilot.press("p")
            assert "PAUSED" in app.query_one(HeaderBar).text
            snapshot = fx.two_ranks()
            source.set(snapshot)
            await pilot.pause(FAST_S * 4)
            assert app.view is not None and app.view.snapshot is not snapshot
            assert app.query_one(RanksTable).row_count == 0
            await pilot.press("p")
            await shown(pilot, snapshot)
            assert app.query_one(RanksTable).row_count == 2
            assert "PAUSED" not in app.query_one(HeaderBar).text

    async def test_enter_opens_the_rank_and_esc_goes_back(self) -> None:
        async with GputopApp(FixedSource(fx.no_gpu()), refresh_s=FAST_S).run_test(size=(120, 40)) as pilot:
            app = await shown(pilot)
            await pilot.press("down", "enter")
            assert isinstance(app.screen, RankDetailScreen)
            assert app.screen.key == "run-cpu:1"
            await pilot.pause()
            title = str(app.screen.query_one("#detail-title").render())
            assert "rank 1" in title
            na = str(app.screen.query_one("#detail-na").render())
            assert "memory: CPU run" in na
            facts = str(app.screen.query_one("#detail-facts").render())
            assert "gloo" in facts and "num_workers" in facts
            await pilot.press("escape")
            assert not isinstance(app.screen, RankDetailScreen)

    async def test_clicking_a_row_opens_it(self) -> None:
        async with GputopApp(FixedSource(fx.two_ranks()), refresh_s=FAST_S).run_test(size=(120, 40)) as pilot:
            app = await shown(pilot)
            table = app.query_one(RanksTable)
            # pilot.click aims at the table's region as laid out now: let the first view's layout settle,
            # or the click lands on the row that was there before (rank 0, the cursor's: it would open).
            await pilot.pause()
            await pilot.wait_for_scheduled_animations()
            await pilot.click(RanksTable, offset=(3, 2))  # header is line 0; rank 1 is line 2
            await pilot.pause()
            assert table.selected_key == "run-a:1" and not isinstance(app.screen, RankDetailScreen), (
                f"the first click should select rank 1: cursor on {table.selected_key}, screen {app.screen}"
            )
            await pilot.click(RanksTable, offset=(3, 2))
            await pilot.pause()
            assert isinstance(app.screen, RankDetailScreen)

    async def test_help_and_quit(self) -> None:
        async with GputopApp(FixedSource(fx.two_ranks()), refresh_s=FAST_S).run_test(size=(80, 24)) as pilot:
            await shown(pilot)
            await pilot.press("question_mark")
            assert isinstance(pilot.app.screen, HelpScreen)
            await pilot.press("escape")
            assert not isinstance(pilot.app.screen, HelpScreen)
            await pilot.press("q")
        assert pilot.app.return_code == 0


class TestFindings:
    """The findings panel says truthfully what the diagnosis did."""

    @pytest.mark.parametrize(
        ("diagnoser", "expected"),
        [
            (None, "no rules active"),
            (FakeDiagnoser(), "no issues found"),
            (FakeDiagnoser(fail=True), "diagnosis failed: RuntimeError: rule exploded"),
        ],
    )
    async def test_nothing_to_show(self, diagnoser: FakeDiagnoser | None, expected: str) -> None:
        factory = (lambda: diagnoser) if diagnoser is not None else None
        app = GputopApp(FixedSource(fx.two_ranks()), refresh_s=FAST_S, diagnoser_factory=factory)
        async with app.run_test(size=(80, 24)) as pilot:
            await shown(pilot)
            assert expected in str(app.query_one(FindingsPanel).render())

    async def test_worst_first(self) -> None:
        diagnoser = FakeDiagnoser([LOADER, STRAGGLER])
        app = GputopApp(FixedSource(fx.two_ranks()), refresh_s=FAST_S, diagnoser_factory=lambda: diagnoser)
        async with app.run_test(size=(120, 40)) as pilot:
            await shown(pilot)
            lines = str(app.query_one(FindingsPanel).render()).splitlines()
            assert "holds the others back" in lines[0]
            assert "waits for data" in lines[2]
            assert "num_workers=8" in lines[3]
            assert diagnoser.calls >= 1


class TestRejections:
    """A connection closed for a bad frame is announced, also while runs are on screen."""

    async def test_a_refused_connection_is_notified_once(self) -> None:
        import dataclasses

        snapshot = fx.two_ranks()
        source = FixedSource(snapshot)
        async with GputopApp(source, refresh_s=FAST_S).run_test(size=(120, 40)) as pilot:
            app = await shown(pilot)
            said: list[str] = []  # as notified: a notification on screen expires after 8 s, on a loaded machine first
            notify = app.notify
            app.notify = lambda message, **kwargs: (said.append(message), notify(message, **kwargs))[1]  # type: ignore[method-assign]
            reason = "closed connection from 127.0.0.1:5555: not JSON: Expecting value"
            refused = dataclasses.replace(snapshot, rejected=(reason,))
            source.set(refused)
            await shown(pilot, refused)
            for _ in range(5):  # later refreshes carry the same reason: no repeat
                await pilot.pause(FAST_S)
            assert said.count(reason) == 1, said


class TestTimeTravel:
    """[ pauses and steps back through the views shown; ] steps forward and, past the newest, resumes."""

    async def test_back_shows_an_earlier_moment_and_forward_returns_live(self) -> None:
        source = FixedSource(fx.two_ranks(n_windows=40))
        async with GputopApp(source, refresh_s=FAST_S).run_test(size=(120, 40)) as pilot:
            app = await shown(pilot)
            later = fx.two_ranks(n_windows=50)
            source.set(later)
            await shown(pilot, later)
            await pilot.press("left_square_bracket")
            await pilot.pause()
            assert app.paused
            assert app.view is not None and app.view.snapshot.t < later.t
            header = app.query_one(HeaderBar).text
            assert "PAUSED -5s" in header  # 10 windows of 0.5 s behind the newest
            await pilot.pause(5 * FAST_S)  # newer views keep arriving while paused: the screen stays put
            assert app.view.snapshot.t < later.t
            while app.paused:
                await pilot.press("right_square_bracket")
            await shown(pilot, later)
            assert app.view.snapshot is later


class TestSharedCpu:
    """When other processes take a real share of the host's CPUs, the findings panel says who, first."""

    def test_the_view_names_who_shares_the_cpus(self) -> None:
        from dataclasses import replace

        from gputop.model.figures import summarize
        from gputop.model.samples import HostSample, ProcessReading
        from gputop.tui.view import build_view

        snapshot = fx.two_ranks()
        host = HostSample(
            t=snapshot.t,
            cpu_pct=100.0,
            cpu_count=2,
            load_1m=5.5,
            processes=(ProcessReading(pid=4100, cpu_pct=25.0), ProcessReading(pid=4101, cpu_pct=27.0)),
            gputop_cpu_pct=8.0,
        )
        view = build_view(summarize(replace(snapshot, host=host, host_history=(host,))))
        assert view.cpu_sharing is not None
        assert "2 CPUs are 100% busy, load 5.5: ranks 0.5 cores, 26% of a core each" in view.cpu_sharing
        assert "other processes 1.4" in view.cpu_sharing
        quiet = replace(host, cpu_pct=60.0)
        assert build_view(summarize(replace(snapshot, host=quiet, host_history=(quiet,)))).cpu_sharing is None


def test_help_lists_every_key() -> None:
    """Each key the dashboard binds, its own and its shell's, is in the ? help, as the user types it."""
    from gputop.tui.screens.help import HELP
    from gputop.tui.shell import Shell

    for binding in [*Shell.BINDINGS, *GputopApp.BINDINGS]:
        assert isinstance(binding, Binding)
        shown = binding.key_display or binding.key
        assert f"`{shown}`" in HELP, f"{binding.action} ({shown}) is missing from the help"
