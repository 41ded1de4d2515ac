"""Where each rank's training thread is, from the wire to the words: the stacks message, its store, the findings.

The messages are made by hand here (``tests/unit/test_stack_sampler.py`` makes them
from real threads); everything after the wire is the real code: the protocol's
checks, a collector's connection, the store, recordings, the figures, the
rules, the report and the detail screen.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest

from gputop.collect import recording
from gputop.collect.capture_relay import CaptureRelay
from gputop.collect.connection import Connection, Intake
from gputop.collect.store import HISTORY_STACKS, Store
from gputop.diagnose import Finding, diagnose
from gputop.diagnose.alerts import Alert
from gputop.export.metrics import families
from gputop.model.figures import SPAN_S, summarize
from gputop.model.frames import merge_stacks, rank_frames
from gputop.model.snapshot import Snapshot
from gputop.protocol import (
    MAX_STACKS_TOP,
    Accepts,
    Bye,
    GroupCalls,
    Hello,
    ProtocolError,
    SampledFrame,
    StackFrame,
    decode,
    decode_command,
    encode,
)
from gputop.report import render
from tests.support.connections import KeptTransport, feed
from tests.support.diagnose_fixtures import T0 as SPEC_T0
from tests.support.diagnose_fixtures import RankSpec, make_snapshot, straggler_of
from tests.support.frames import LOCK, METRIC, T0, hung_run, stacks, with_stacks


class TestTheMessage:
    def test_it_round_trips_as_arrays(self) -> None:
        message = stacks(1, 5.0, top=(METRIC, SampledFrame("forward", "model.py", 30, "Block.forward", 20)))
        frame = encode(message)
        assert b'"top":[["after_step","train.py",57,"compute_metrics",38],' in frame
        assert b'"now":["after_step","train.py",102,"wait_for_lock"]' in frame
        assert decode(frame) == message

    @pytest.mark.parametrize(
        ("change", "complaint"),
        [
            ({"samples": 10}, "count more samples"),
            ({"top": [["after_step", "train.py", 57, "f", 1]] * (MAX_STACKS_TOP + 1)}, "length"),
            ({"top": [["after_step", "train.py", -1, "f", 1]]}, r">= 0 - at `\$.top\[0\]\[2\]`"),
            ({"now": ["x" * 33, "train.py", 1, "f"]}, "length"),
            ({"now": ["outside", "f" * 257, 1, "f"]}, "length"),
            ({"now": ["outside", "train.py", 1]}, "length"),
        ],
    )
    def test_what_no_reporter_sends_is_refused(self, change: dict[str, object], complaint: str) -> None:
        obj = json.loads(encode(stacks(1, 5.0, top=(METRIC,))))
        obj.update(change)
        with pytest.raises(ProtocolError, match=complaint):
            decode(json.dumps(obj))

    def test_accepts_is_a_command(self) -> None:
        command = Accepts(run_id="run", rank=1, types=("stacks",))
        assert decode_command(encode(command)) == command


class TestTheCollector:
    def test_a_hello_that_offers_stacks_is_answered_and_its_stacks_are_kept(self) -> None:
        store = Store()
        connection, transport = Connection(Intake(store, CaptureRelay(), greet=False, token="")), KeptTransport()
        connection.connection_made(transport)
        feed(connection, encode(Hello(run_id="run", rank=1, world_size=2, pid=7, sends=("stacks", "later"))))
        (answer,) = [decode_command(line) for line in bytes(transport.written).splitlines()]
        assert answer == Accepts(run_id="run", rank=1, types=("stacks",))  # only what it reads
        feed(connection, encode(stacks(1, T0 + 1, top=(METRIC,))))
        (view,) = store.snapshot(T0 + 2).all_ranks()
        assert view.latest_stacks == stacks(1, T0 + 1, top=(METRIC,)) and not transport.closed

    def test_a_hello_from_an_older_reporter_is_told_nothing(self) -> None:
        connection, transport = Connection(Intake(Store(), CaptureRelay(), greet=False, token="")), KeptTransport()
        connection.connection_made(transport)
        feed(connection, encode(Hello(run_id="run", rank=0, pid=7)))
        assert bytes(transport.written) == b""  # an old reporter would call an unknown command an error

    def test_the_store_keeps_the_newest_and_a_recording_keeps_them_all(self, tmp_path: Path) -> None:
        store = Store()
        store.ingest(Hello(run_id="run", rank=0, pid=7), T0)
        for k in range(HISTORY_STACKS + 5):
            store.ingest(stacks(0, T0 + k), T0 + k)
        (view,) = store.snapshot(T0 + 40).all_ranks()
        assert len(view.stacks) == HISTORY_STACKS and view.stacks[-1].t == T0 + HISTORY_STACKS + 4
        path = tmp_path / "run.jsonl"
        rec = recording.Recorder(path, source="test")
        rec.message(Hello(run_id="run", rank=0, pid=7), T0)
        for k in range(HISTORY_STACKS + 5):
            rec.message(stacks(0, T0 + k), T0 + k)
        rec.close()
        loaded, last_t = recording.load(path)
        (view,) = loaded.snapshot(last_t).all_ranks()
        assert len(view.stacks) == HISTORY_STACKS + 5

    def test_merged_recordings_add_the_counts_and_keep_the_newest_place(self, tmp_path: Path) -> None:
        path = tmp_path / "run.jsonl"
        rec = recording.Recorder(path, source="test", merge_after_s=0.0, merge_s=10.0)
        t0 = rec.started_t
        rec.message(Hello(run_id="run", rank=0, pid=7), t0)
        for k in range(1, 26):  # 25 one-second messages: 10 + 10 merged, 5 flushed by the bye
            place = LOCK if k < 25 else StackFrame("loader", "data.py", 9, "read")
            rec.message(stacks(0, t0 + k, top=(msgspec.structs.replace(METRIC, count=k),), now=place), t0 + k)
        rec.message(Bye(run_id="run", rank=0, t=t0 + 26), t0 + 26)
        rec.close()
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        merged = [line for line in lines if line["type"] == "stacks"]
        assert [m["samples"] for m in merged] == [1000, 1000, 500]
        assert sum(m["top"][0][4] for m in merged) == sum(range(1, 26))
        loaded, last_t = recording.load(path)
        frames = rank_frames(loaded.snapshot(last_t).all_ranks()[0])
        assert frames is not None and frames.samples == 2500
        assert frames.now is not None and frames.now.function == "read"

    def test_merge_keeps_the_most_counted_places(self) -> None:
        many = [
            stacks(
                0,
                T0 + k,
                samples=200,
                top=tuple(SampledFrame("outside", "a.py", n, f"f{n}", n) for n in range(k * 5, k * 5 + 5)),
            )
            for k in range(6)
        ]  # 30 functions, counted 0-29 times
        merged = merge_stacks(many)
        assert len(merged.top) == MAX_STACKS_TOP and merged.samples == 1200
        assert [f.line for f in merged.top] == list(range(29, 9, -1))

    def test_one_functions_lines_are_one_place_at_its_most_sampled_line(self) -> None:
        store = Store()
        store.ingest(Hello(run_id="run", rank=0, pid=7), T0)
        store.ingest(stacks(0, T0 + 1, top=(SampledFrame("after_step", "m.py", 5, "update", 20),)), T0 + 1)
        store.ingest(stacks(0, T0 + 2, top=(SampledFrame("after_step", "m.py", 7, "update", 30),)), T0 + 2)
        store.ingest(stacks(0, T0 + 3, top=(SampledFrame("after_step", "m.py", 5, "update", 15),)), T0 + 3)
        frames = rank_frames(store.snapshot(T0 + 3).all_ranks()[0])
        assert frames is not None and [(f.frame.line, f.samples) for f in frames.top] == [(5, 65)]


class TestRankFrames:
    def test_the_span_counts_and_the_newest_place(self) -> None:
        store = Store()
        store.ingest(Hello(run_id="run", rank=1, pid=7), T0)
        store.ingest(stacks(1, T0 + 1, top=(msgspec.structs.replace(METRIC, count=90),)), T0 + 1)  # before the span
        store.ingest(stacks(1, T0 + 20, top=(METRIC, SampledFrame("forward", "model.py", 30, "fwd", 12))), T0 + 20)
        store.ingest(stacks(1, T0 + 21, top=(METRIC,)), T0 + 21)
        view = store.snapshot(T0 + 21).all_ranks()[0]
        frames = rank_frames(view, since_t=T0 + 11)
        assert frames is not None and frames.samples == 200
        assert [(f.frame.function, f.samples, f.share) for f in frames.top] == [
            ("compute_metrics", 76, 0.38),
            ("fwd", 12, 0.06),
        ]
        assert frames.now is not None and frames.now.place == "`wait_for_lock` (train.py:102)"
        assert frames.text() == (
            "now in `wait_for_lock` (train.py:102), after the optimizer step; "
            "most: 38% in `compute_metrics` (train.py:57), after the optimizer step, 6% in `fwd` (model.py:30), "
            "in the forward pass"
        )
        whole = rank_frames(view)
        assert whole is not None and whole.samples == 300 and whole.top[0].samples == 166

    def test_a_rank_that_sends_none_has_none(self) -> None:
        store = Store()
        store.ingest(Hello(run_id="run", rank=0, pid=7), T0)
        assert rank_frames(store.snapshot(T0).all_ranks()[0]) is None


def only(findings: list[Finding], cause: str) -> Finding:
    (finding,) = [f for f in findings if f.cause == cause]
    return finding


def live(snapshot: Snapshot) -> list[Finding]:
    return diagnose(summarize(snapshot, span_s=SPAN_S))


class TestFindingsNameThePlace:
    def test_a_hang_names_the_blocked_place_and_who_waits_for_it(self) -> None:
        hung = hung_run()
        backward = StackFrame("backward", "train.py", 88, "main")
        plain = only(live(hung), "hang")
        named = only(live(with_stacks(hung, {0: [stacks(0, T0 + 27, now=backward)], 1: [stacks(1, T0 + 27)]})), "hang")
        assert named.title == (
            plain.title + "; rank 1 is in `wait_for_lock` (train.py:102), after the optimizer step; "
            "rank 0 waits in the all-reduce"
        )
        # The rank on the lock is the hang; the one in the all-reduce waits for it (without stacks, both named).
        assert named.severity == plain.severity and plain.ranks == (0, 1)
        assert named.ranks == (1,) and named.waiting_ranks == (0,)
        assert named.to_dict()["frames"]["1"]["now"]["function"] == "wait_for_lock"
        assert plain.frames == ()

    def test_without_ddp_a_backward_is_a_place_and_a_collective_is_a_wait(self) -> None:
        barrier = StackFrame("collective", "train.py", 80, "sync")
        backward = StackFrame("backward", "train.py", 88, "main")
        named = only(
            live(
                with_stacks(
                    hung_run(ddp=False), {0: [stacks(0, T0 + 27, now=barrier)], 1: [stacks(1, T0 + 27, now=backward)]}
                )
            ),
            "hang",
        )
        assert named.title.endswith(
            "; rank 1 is in `main` (train.py:88), in the backward pass; "
            "rank 0 waits in a collective from `sync` (train.py:80)"
        )

    def test_a_stall_names_the_place_that_holds_it(self) -> None:
        specs = [RankSpec(rank=0, step_s=0.1, stall_s=0.4), RankSpec(rank=1, step_s=0.1)]
        snapshot = make_snapshot(specs)
        plain = only(live(snapshot), "stall")
        assert plain.ranks == (0,), plain.title
        share = plain.magnitude
        save = SampledFrame("after_step", "train.py", 88, "write_snapshot", round(100 * share))
        named = only(live(with_stacks(snapshot, {0: [stacks(0, SPEC_T0 + 9, top=(save,))]})), "stall")
        assert named.title == plain.title + ", in `write_snapshot` (train.py:88), after the optimizer step"
        scattered = msgspec.structs.replace(save, count=round(100 * share / 3))  # a third of the stall: not its place
        assert only(live(with_stacks(snapshot, {0: [stacks(0, SPEC_T0 + 9, top=(scattered,))]})), "stall").title == (
            plain.title
        )

    def test_a_stall_is_said_as_the_stop_and_a_stop_jitter_can_make_is_none(self) -> None:
        # A 400-ms step among 100-ms ones is a 300-ms stop; a 9-ms step among 2-ms ones is a lost time slice.
        stall = only(live(make_snapshot([RankSpec(rank=0, step_s=0.1, stall_s=0.4), RankSpec(rank=1, step_s=0.1)])),
                     "stall")  # fmt: skip
        assert re.match(r"rank 0 stops (29\d|30\d) ms ", stall.title), stall.title
        # 2-ms steps, a fifth of them 9 ms (a quarter of the run): a share past the critical line, but no stop a
        # script makes; 50-ms ones as often are stops.
        jitter = make_snapshot([RankSpec(rank=r, step_s=0.002, stall_s=0.009, stalls_per_window=100) for r in (0, 1)])
        assert not [f for f in live(jitter) if f.cause == "stall"]
        stops = make_snapshot([RankSpec(rank=r, step_s=0.002, stall_s=0.05, stalls_per_window=10) for r in (0, 1)])
        assert only(live(stops), "stall").severity == "critical"

    def test_a_rank_that_waits_in_its_own_collective_is_not_named_as_stopping(self) -> None:
        # Rank 0 saves a checkpoint; rank 1 waits for it in dist.all_reduce(loss), outside DDP's timed
        # exchange, so both stall alike and only where their training threads were tells them apart.
        specs = [RankSpec(rank=0, step_s=0.1, stall_s=0.4), RankSpec(rank=1, step_s=0.1, stall_s=0.4)]
        snapshot = make_snapshot(specs)
        plain = only(live(snapshot), "stall")
        assert plain.ranks == (0, 1), plain.title
        share = round(100 * plain.magnitude)
        save = SampledFrame("after_step", "train.py", 88, "write_snapshot", share)
        log = SampledFrame("collective", "train.py", 61, "log_loss", share)
        named = only(
            live(
                with_stacks(
                    snapshot, {0: [stacks(0, SPEC_T0 + 9, top=(save,))], 1: [stacks(1, SPEC_T0 + 9, top=(log,))]}
                )
            ),
            "stall",
        )
        assert named.ranks == (0,)
        assert named.title.startswith("rank 0 stops ")
        assert named.title.endswith(
            ", in `write_snapshot` (train.py:88), after the optimizer step; "
            "rank 1 waits for it in `log_loss` (train.py:61), in a collective (all-reduce, barrier, ...)"
        )
        both_wait = with_stacks(snapshot, {r: [stacks(r, SPEC_T0 + 9, top=(log,))] for r in (0, 1)})
        assert only(live(both_wait), "stall").ranks == (0, 1)  # no rank left that stopped: both are named

    def test_a_straggler_outside_the_phases_names_its_place(self) -> None:
        specs = [
            RankSpec(rank=0, loader_frac=0.01, forward_frac=0.2, backward_frac=0.3, comm_frac=0.45, overlap_frac=0.05),
            RankSpec(rank=1, loader_frac=0.01, forward_frac=0.2, backward_frac=0.3, comm_frac=0.07, overlap_frac=0.05),
        ]
        snapshot = make_snapshot(specs)
        plain = only(live(snapshot), "straggler")
        assert straggler_of(plain).phase == "other", plain.title
        named = only(live(with_stacks(snapshot, {1: [stacks(1, SPEC_T0 + 9, top=(METRIC,))]})), "straggler")
        head, _, tail = plain.title.partition("; the others wait")
        assert named.title == (
            head + "; it spends 38% of each step in `compute_metrics` (train.py:57), after the optimizer step"
            "; the others wait" + tail
        )
        assert named.severity == plain.severity and named.to_dict()["frames"]["1"]["top"][0]["share_pct"] == 38.0

    def test_an_excess_in_no_one_phase_that_the_samples_place_outside_the_model_is_that_work_title_and_fix(
        self,
    ) -> None:
        # Rank 1's 30% excess is spread over forward, backward and the rest by the phases' clocks, but its samples
        # find 25% of its step in a metric after the optimizer step: the title and the fix both say that work.
        specs = [
            RankSpec(rank=0, forward_frac=0.2, backward_frac=0.3, comm_frac=0.42, overlap_frac=0.05),
            RankSpec(rank=1, forward_frac=0.305, backward_frac=0.4, comm_frac=0.1, overlap_frac=0.05),
        ]
        snapshot = make_snapshot(specs)
        spread = only(live(snapshot), "straggler")
        assert straggler_of(spread).phase == "own" and "spread over its phases" in spread.title, spread.title
        assert "it takes longer for the same work" in spread.suggestion  # nothing places it: the same work is slower
        metric = SampledFrame("after_step", "train.py", 57, "expensive_metric", 25)
        placed = only(live(with_stacks(snapshot, {1: [stacks(1, SPEC_T0 + 9, top=(metric,))]})), "straggler")
        assert straggler_of(placed).phase == "other", placed.title
        assert "spread over" not in placed.title and "more of each step than the others, outside" in placed.title
        spends = "it spends 25% of each step in `expensive_metric` (train.py:57), after the optimizer step"
        assert spends in placed.title, placed.title
        assert placed.suggestion.startswith(
            "rank 1 does extra work each step outside the model that the others do not, in `expensive_metric` "
            "(train.py:57), after the optimizer step: move it off the step"
        ), placed.suggestion
        assert "same work" not in placed.suggestion

    def test_work_the_others_do_not_do_is_named_when_their_slower_compute_hides_it(self) -> None:
        # Rank 1 computes a metric after each step (21 points more time outside the model than rank 0),
        # while a neighbour slows rank 0's backward by 15 ms: rank 1's own time stands out only 6%,
        # under the line, yet the others still wait for it every step.
        specs = [
            RankSpec(rank=0, loader_frac=0.01, forward_frac=0.2, backward_frac=0.45, comm_frac=0.30, overlap_frac=0.05),
            RankSpec(rank=1, loader_frac=0.01, forward_frac=0.2, backward_frac=0.30, comm_frac=0.24, overlap_frac=0.05),
        ]
        snapshot = make_snapshot(specs)
        assert not [f for f in live(snapshot) if f.cause == "straggler"]  # no stacks: nothing places the work
        metric = SampledFrame("after_step", "train.py", 57, "compute_metrics", 20)
        few = SampledFrame("after_step", "train.py", 57, "compute_metrics", 2)
        named = only(live(with_stacks(snapshot, {1: [stacks(1, SPEC_T0 + 9, top=(metric,))]})), "straggler")
        assert named.ranks == (1,) and named.severity == "info" and straggler_of(named).phase == "other"
        assert "it spends 20% of each step in `compute_metrics` (train.py:57), after the optimizer step" in named.title
        assert named.title.endswith(
            "the others wait for it 6% of each step, less than that work: their backward pass takes 15 ms more "
            "than its, which hides it (it will cost more once they are faster)"
        ), named.title
        assert named.cost_s == pytest.approx(0.006)
        # A few samples outside the model are scheduling noise, not a place that holds the work.
        assert not [
            f for f in live(with_stacks(snapshot, {1: [stacks(1, SPEC_T0 + 9, top=(few,))]})) if f.cause == "straggler"
        ]

    def test_hidden_work_split_between_the_functions_it_runs_through_is_named_as_one(self) -> None:
        # The metric's samples name the innermost function of the user's code: the loop that calls it, the
        # metric's update and a generator in it, 9 + 6 + 4 of 21 points measured, no one of them half.
        specs = [
            RankSpec(rank=0, loader_frac=0.01, forward_frac=0.2, backward_frac=0.45, comm_frac=0.30, overlap_frac=0.05),
            RankSpec(rank=1, loader_frac=0.01, forward_frac=0.2, backward_frac=0.30, comm_frac=0.24, overlap_frac=0.05),
        ]
        snapshot = make_snapshot(specs)
        split = (
            SampledFrame("after_step", "train.py", 119, "main", 9),
            SampledFrame("after_step", "train.py", 96, "<genexpr>", 6),
            SampledFrame("after_step", "train.py", 93, "Metric.update", 4),
        )
        named = only(live(with_stacks(snapshot, {1: [stacks(1, SPEC_T0 + 9, top=split)]})), "straggler")
        assert named.ranks == (1,) and straggler_of(named).phase == "other"
        assert (
            "it spends 19% of each step after the optimizer step: 9% in `main` (train.py:119), "
            "6% in `<genexpr>` (train.py:96), 4% in `Metric.update` (train.py:93); the others wait"
        ) in named.title, named.title
        # The same places in every rank's samples are the script's own, not work this rank does more of.
        everyone = {r: [stacks(r, SPEC_T0 + 9, top=split)] for r in (0, 1)}
        assert not [f for f in live(with_stacks(snapshot, everyone)) if f.cause == "straggler"]


class TestWhereItShows:
    def test_the_report_carries_each_ranks_frames(self) -> None:
        snapshot = with_stacks(
            make_snapshot([RankSpec(rank=0), RankSpec(rank=1)]), {1: [stacks(1, SPEC_T0 + 9, top=(METRIC,))]}
        )
        ranks = json.loads(render(snapshot, "json"))["runs"][0]["ranks"]
        assert ranks[0]["frames"] is None
        assert ranks[1]["frames"]["now"] == {"where": "after_step", "file": "train.py", "line": 102,
                                             "function": "wait_for_lock"}  # fmt: skip
        (top,) = ranks[1]["frames"]["top"]
        assert top == {"where": "after_step", "file": "train.py", "line": 57, "function": "compute_metrics",
                       "samples": 38, "share_pct": 38.0}  # fmt: skip
        text = render(snapshot, "text")
        assert "  rank 1 now in `wait_for_lock` (train.py:102), after the optimizer step; most: 38% in " in text
        assert "rank 0 now" not in text

    def test_the_alert_payload_and_the_exporter_carry_the_place(self) -> None:
        specs = [
            RankSpec(rank=0, loader_frac=0.01, forward_frac=0.2, backward_frac=0.3, comm_frac=0.45, overlap_frac=0.05),
            RankSpec(rank=1, loader_frac=0.01, forward_frac=0.2, backward_frac=0.3, comm_frac=0.07, overlap_frac=0.05),
        ]
        snapshot = with_stacks(make_snapshot(specs), {1: [stacks(1, SPEC_T0 + 9, top=(METRIC,))]})
        figures = summarize(snapshot, span_s=SPAN_S)
        straggler = only(diagnose(figures), "straggler")
        payload = Alert("raised", straggler, SPEC_T0 + 10, 30.0).to_dict()  # what an --on-finding command reads
        (top,) = payload["finding"]["frames"]["1"]["top"]
        assert (top["function"], top["file"], top["line"], top["where"]) == ("compute_metrics", "train.py", 57,
                                                                            "after_step")  # fmt: skip
        by_name = {f.spec.name: f for f in families(figures, [straggler], gpu_hostname="node0")}
        family = by_name["gputop_rank_top_frame_ratio"]
        (series,) = [dict(zip(family.spec.labels, labels, strict=True)) | {"value": v} for labels, v in family.samples]
        assert series["rank"] == "1" and series["function"] == "compute_metrics" and series["line"] == "57"
        assert series["value"] == pytest.approx(0.38)

    def test_the_exporter_carries_each_stuck_ranks_collective_number_per_group(self) -> None:
        """What the job rules compare across exporters to name the ranks behind (gputop:collectives_behind)."""
        groups = (GroupCalls("dp", 88, 40, 39, "all_gather", 1 << 20, True), GroupCalls("tp", None, 3, 3))
        numbered = msgspec.structs.replace(stacks(1, SPEC_T0 + 9), groups=groups)
        stuck = {0: [stacks(0, SPEC_T0 + 9)], 1: [numbered]}
        snapshot = with_stacks(make_snapshot([RankSpec(rank=0), RankSpec(rank=1)]), stuck)
        by_name = {f.spec.name: f for f in families(summarize(snapshot, span_s=SPAN_S), [], gpu_hostname="node0")}
        family = by_name["gputop_collective_number"]
        series = [dict(zip(family.spec.labels, labels, strict=True)) | {"value": v} for labels, v in family.samples]
        # Rank 0's message numbered nothing (it was stepping); tp's count is unknown to this torch: no series.
        assert [(s["rank"], s["group"], s["value"]) for s in series] == [("1", "dp", 88.0)], series
