"""torch's Flight Recorder read in a hang: the last collective each rank entered names the one that never joined."""

from __future__ import annotations

import json
import sys
import time
import types
from typing import Any

import msgspec
import pytest

from gputop.address import Address
from gputop.collect.server import Collector
from gputop.diagnose import diagnose
from gputop.diagnose.rules.hang import flight_recorder_text
from gputop.model.figures import SPAN_S, summarize
from gputop.protocol import Collective, StackFrame, Stacks, decode, encode
from gputop.reporter import flight_recorder
from gputop.reporter.flight_recorder import FlightRecorderReader, last_entered
from gputop.reporter.reporter import Reporter
from tests.support.collectors import snapshot_of, wait_for
from tests.support.frames import T0, hung_run, stacks, with_stacks

# What torch 2.13's _dump_fr_trace_json() gives on gloo (fields trimmed to those read, plus a few).
ENTRY: dict[str, Any] = {  # a dump's entry, as torch writes it
    "collective_seq_id": 40, "is_p2p": False, "op_id": 40, "pg_id": 0, "process_group": ["0", "default_pg"],
    "profiling_name": "gloo:all_reduce", "record_id": 39, "retired": True, "state": "scheduled",
    "time_created_ns": 1_795_611_157_473_351_693, "timeout_ms": 1_800_000,
}  # fmt: skip


def trace(*entries: dict[str, object]) -> dict[str, object]:
    return {"version": "2.10", "pg_config": {}, "entries": list(entries)}


class TestReading:
    @pytest.mark.parametrize(
        ("env", "on"),
        [
            ({}, False),
            ({"TORCH_FR_BUFFER_SIZE": "2000"}, True),
            ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}, True),
            ({"TORCH_FR_BUFFER_SIZE": "0", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}, False),  # torch reads FR first
            ({"TORCH_FR_BUFFER_SIZE": "lots"}, False),
        ],
    )
    def test_on_only_where_the_user_turned_it_on(self, env: dict[str, str], on: bool) -> None:
        assert flight_recorder.enabled(env) is on

    def test_the_last_entered_collective_is_the_newest_entry_not_a_send(self) -> None:
        newer = ENTRY | {"collective_seq_id": 41, "record_id": 40, "time_created_ns": ENTRY["time_created_ns"] + 10**6}
        send = ENTRY | {"is_p2p": True, "profiling_name": "gloo:send", "time_created_ns": newer["time_created_ns"] + 1}
        assert last_entered(trace(ENTRY, newer, send)) == Collective("gloo:all_reduce", 41, "scheduled", "default_pg")
        assert last_entered(trace()) is None
        assert last_entered({"entries": None}) is None

    def test_read_only_while_no_step_finishes_and_then_every_few_seconds(self) -> None:
        dumps: list[int] = []

        def dump() -> bytes:
            dumps.append(1)
            return json.dumps(trace(ENTRY)).encode()

        reader = FlightRecorderReader(dump)
        assert reader.read_if_stuck(100.0, since_step_s=0.05) is None and not dumps  # stepping: a dump costs
        assert reader.read_if_stuck(100.0, since_step_s=None) is None and not dumps  # not started
        stuck = flight_recorder.STUCK_AFTER_S
        assert reader.read_if_stuck(100.0, since_step_s=stuck) == last_entered(trace(ENTRY))
        assert reader.read_if_stuck(101.0, since_step_s=stuck + 1) is not None and len(dumps) == 1  # the last read
        reader.read_if_stuck(100.0 + flight_recorder.READ_EVERY_S, since_step_s=stuck + 5)
        assert len(dumps) == 2
        assert reader.read_if_stuck(110.0, since_step_s=0.01) is None  # stepping again: forgotten

    def test_it_rides_the_stacks_message(self) -> None:
        message = Stacks(run_id="r", rank=1, t=T0, samples=0, collective=Collective("nccl:all_reduce", 7, "started"))
        assert decode(encode(message)) == message
        older = Stacks(run_id="r", rank=1, t=T0, samples=0)
        decoded = decode(encode(older))
        assert isinstance(decoded, Stacks) and decoded.collective is None


def fake_torch(monkeypatch: pytest.MonkeyPatch, **c10d: object) -> None:
    """``torch._C._distributed_c10d`` with only these names, in place of whatever torch is (or is not) installed."""
    torch, torch_c = types.ModuleType("torch"), types.ModuleType("torch._C")
    torch._C = torch_c  # type: ignore[attr-defined]
    torch_c._distributed_c10d = types.SimpleNamespace(**c10d)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch._C", torch_c)
    monkeypatch.delitem(sys.modules, "torch._C._distributed_c10d", raising=False)  # a real one, imported earlier


class TestATorchWithoutTheDump:
    """The dump is private (torch._C._distributed_c10d): missing, the recorder is not read, and that is said."""

    def test_the_generic_dump_first_then_nccls_then_none(self, monkeypatch: pytest.MonkeyPatch) -> None:
        calls: list[tuple[str, dict[str, object]]] = []

        def named(name: str) -> object:
            return lambda **kw: calls.append((name, kw)) or b"{}"

        fake_torch(monkeypatch, _dump_fr_trace_json=named("fr"), _dump_nccl_trace_json=named("nccl"))
        dump = flight_recorder.dump_function()
        assert dump is not None and dump() == b"{}"
        fake_torch(monkeypatch, _dump_nccl_trace_json=named("nccl"))  # NCCL's, torch 2.5-2.7
        dump = flight_recorder.dump_function()
        assert dump is not None and dump() == b"{}"
        assert calls == [(n, {"includeCollectives": True, "onlyActive": False}) for n in ("fr", "nccl")]
        fake_torch(monkeypatch)  # neither: torch before 2.5, or a CPU build before 2.8
        assert flight_recorder.dump_function() is None

    def test_no_torch_no_dump(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in ("torch", "torch._C", "torch._C._distributed_c10d"):  # None: a module that cannot be imported
            monkeypatch.setitem(sys.modules, name, None)
        assert flight_recorder.dump_function() is None

    def test_the_rank_says_why_once_when_the_user_turned_it_on(
        self, monkeypatch: pytest.MonkeyPatch, collector: Collector
    ) -> None:
        fake_torch(monkeypatch)
        monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "2000")
        reporter = Reporter(collector.address)  # not started: the test closes its windows by hand
        reporter.side.facts.update({"run_id": "fr", "rank": 0, "world_size": 1})
        for _ in range(3):
            reporter.thread._close_window(time.time())

        def delivered() -> bool:
            reporter.thread.sender.pump()
            ranks = snapshot_of(collector).all_ranks()
            return bool(ranks) and len(ranks[0].windows) == 3

        assert wait_for(delivered)
        (rank,) = snapshot_of(collector).all_ranks()
        said = [(e.kind, e.message) for e in rank.events]
        assert said == [("not_measured", f"flight_recorder: {flight_recorder.NO_DUMP}")]
        reporter.thread.sender.close()

    def test_nothing_is_said_where_the_user_did_not_turn_it_on(self, monkeypatch: pytest.MonkeyPatch) -> None:
        fake_torch(monkeypatch)
        monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
        monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE", raising=False)
        reporter = Reporter(Address(port=1))
        assert not reporter.thread.stacks.flight_missing and reporter.thread.stacks._flight is None
        reporter.thread.sender.close()


def test_a_hang_names_the_rank_that_never_joined_the_newest_collective() -> None:
    """Rank 1 blocks on a lock after step 40; rank 0 entered the next all-reduce (#41), which rank 1 never joined."""
    hung = hung_run()
    lock = StackFrame("after_step", "train.py", 102, "wait_for_lock")
    backward = StackFrame("backward", "train.py", 88, "main")
    messages = {
        0: msgspec.structs.replace(
            stacks(0, T0 + 27, now=backward), collective=Collective("gloo:all_reduce", 41, "scheduled")
        ),
        1: msgspec.structs.replace(
            stacks(1, T0 + 27, now=lock), collective=Collective("gloo:all_reduce", 40, "scheduled")
        ),
    }
    figures = summarize(with_stacks(hung, {r: [m] for r, m in messages.items()}), span_s=SPAN_S)
    (hang,) = [f for f in diagnose(figures) if f.cause == "hang"]
    assert hang.title.endswith(
        "; Flight Recorder: rank 0 entered gloo:all_reduce #41, rank 1's last was gloo:all_reduce #40"
    ), hang.title
    assert hang.to_dict()["frames"]["0"]["collective"] == {"name": "gloo:all_reduce", "seq": 41, "state": "scheduled",
                                                     "group": ""}  # fmt: skip


@pytest.mark.parametrize(
    ("entered", "said"),
    [
        ({1: 35}, "Flight Recorder: rank 1's last collective was gloo:all_reduce #35"),  # rank 0's reporter silent
        ({0: 41, 1: 41}, "Flight Recorder: ranks 0, 1 last entered gloo:all_reduce #41"),  # all in one
        (
            {0: 41, 1: 40, 2: 41},
            "Flight Recorder: ranks 0, 2 entered gloo:all_reduce #41, rank 1's last was gloo:all_reduce #40",
        ),
    ],
)
def test_the_title_claims_only_what_the_ranks_that_could_say_said(entered: dict[int, int], said: str) -> None:
    collectives = {rank: Collective("gloo:all_reduce", seq, "scheduled") for rank, seq in entered.items()}
    assert flight_recorder_text(collectives) == said


# -- without the recorder: the process group's own count (issue #48) ------------------------------------------


def test_without_the_recorder_the_title_numbers_the_collective_each_rank_issued_last() -> None:
    """torch numbers every collective of a group on every rank: a rank whose count is behind never issued the
    newest one, whatever issued it (DDP's C++ all-reduce, a barrier, the script)."""
    counted = {rank: Collective("", seq, flight_recorder.ISSUED, "default_pg") for rank, seq in {0: 41, 1: 40}.items()}
    assert flight_recorder_text(counted) == (
        "rank 0 entered collective #41 on default_pg, rank 1's last was collective #40 on default_pg"
    )
    assert flight_recorder_text({1: counted[1]}) == "rank 1's last was collective #40 on default_pg"  # rank 0 silent


def test_the_default_groups_count_is_read_only_while_stuck(tmp_path: Any) -> None:
    """A one-rank gloo group after three all-reduces, a broadcast and a barrier: its count is 5, the number of
    the last it issued; read only once no step has finished for STUCK_AFTER_S."""
    torch = pytest.importorskip("torch")  # the fast tier's floors run without it
    import torch.distributed as dist

    assert flight_recorder.issued_on_default_group(60.0) is None  # no process group yet
    store = dist.FileStore(str(tmp_path / "store"), 1)  # type: ignore[attr-defined, unused-ignore]
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        tensor = torch.ones(3)
        for _ in range(3):
            dist.all_reduce(tensor)
        dist.broadcast(tensor, 0)
        dist.barrier()
        stuck = flight_recorder.STUCK_AFTER_S + 1
        assert flight_recorder.issued_on_default_group(stuck) == Collective("", 5, "issued", "default_pg")
        assert flight_recorder.issued_on_default_group(flight_recorder.STUCK_AFTER_S - 1) is None  # stepping
        assert flight_recorder.issued_on_default_group(None) is None  # before the first step
    finally:
        dist.destroy_process_group()
