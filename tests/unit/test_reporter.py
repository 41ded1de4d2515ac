"""The reporter inside a training process: never raises, never reports from forks, off when disabled."""

from __future__ import annotations

import socket
import time

import msgspec
import pytest

from gputop.reporter.clock import StepClock, TrackedLoader
from gputop.reporter.facts import loader_facts, run_id
from tests.support.collectors import snapshot_of, wait_for, window_count
from tests.support.processes import free_port, run_script


def test_tracked_loader_yields_the_same_batches_and_times_each_wait() -> None:
    clock = StepClock()
    data = [1, 2, 3]
    tracked = TrackedLoader(data, clock)
    assert list(tracked) == [1, 2, 3]
    assert len(tracked) == 3
    clock.mark_step()
    (mark,) = clock.drain()
    assert mark.batches == 3 and mark.loader_wait_s >= 0 and mark.duration_s is None


def test_the_loaders_own_errors_pass_through_unchanged() -> None:
    def broken():
        yield 1
        raise KeyError("bad sample 7")

    with pytest.raises(KeyError, match="bad sample 7"):
        list(TrackedLoader(broken(), StepClock()))


def test_a_failing_cuda_event_is_swallowed_and_events_are_dropped() -> None:
    clock = StepClock()

    class Failing:
        def record_step(self) -> None:
            raise RuntimeError("CUDA error: an illegal memory access")

    clock.gpu_steps = Failing()
    clock.mark_step()  # must not raise into training
    clock.mark_step()
    assert clock.errors == 1 and clock.gpu_steps is None
    assert len(clock.drain()) == 2  # both steps counted, without GPU events


def test_loader_facts_read_what_a_dataloader_has() -> None:
    class Loader:
        batch_size = 32
        num_workers = 4
        pin_memory = True
        persistent_workers = False
        prefetch_factor = None

    assert loader_facts(Loader()) == {
        "loader_batch_size": 32,
        "loader_num_workers": 4,
        "loader_pin_memory": True,
        "loader_persistent_workers": False,
    }
    assert loader_facts([1, 2]) == {}


def test_a_loader_built_from_a_batch_sampler_takes_the_samplers_batch_size() -> None:
    """Accelerate's prepared loader has batch_size None and a BatchSamplerShard of the rank's batch."""

    class Sampler:
        batch_size = 8
        split_batches = False

    class Prepared:
        batch_size = None
        batch_sampler = Sampler()

    assert loader_facts(Prepared())["loader_batch_size"] == 8
    Sampler.split_batches = True  # one global batch split across the processes: the rank's share is unknown here
    assert "loader_batch_size" not in loader_facts(Prepared())


def test_run_id_is_shared_by_the_ranks_of_one_launch() -> None:
    assert run_id({"GPUTOP_RUN_ID": "mine"}) == "mine"
    env = {"TORCHELASTIC_RUN_ID": "abc", "LOCAL_RANK": "1"}
    assert run_id(env, 2).endswith("-abc")
    torchrun = {"TORCHELASTIC_RUN_ID": "none", "MASTER_PORT": "29500"}
    assert run_id(torchrun, 2) == run_id({**torchrun, "LOCAL_RANK": "1"}, 2)  # same agent pid
    spawned = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "LOCAL_RANK": "0"}
    assert run_id(spawned, 2) == run_id({**spawned, "LOCAL_RANK": "1"}, 2)
    assert run_id(spawned, 2) != run_id({**spawned, "MASTER_PORT": "29501"}, 2)


def test_an_unusable_address_turns_gputop_off_with_one_line(tmp_path) -> None:
    code = """
        import gputop
        assert gputop.watch() is None
        assert gputop.track([1, 2]) == [1, 2]
        gputop.step()
        print("trained")
    """
    result = run_script(code, None, GPUTOP_PORT="not-a-port")
    assert result.returncode == 0 and result.stdout.strip() == "trained"
    assert (
        result.stderr.strip()
        == "gputop: GPUTOP_PORT='not-a-port' is not a port number; reporting is off for this process"
    )


def test_a_rank_that_learns_its_name_late_is_not_refused_after_reconnecting(collector) -> None:
    """track()/step() before init_process_group name the rank by pid; the real name replaces it cleanly."""
    from gputop.protocol import Window, encode
    from gputop.reporter.reporter import Reporter

    reporter = Reporter(collector.address)  # not started: the test drives it by hand
    sender = reporter.thread.sender
    sender.close()
    reporter.side.facts.update({"run_id": "script-123", "rank": 0, "world_size": 1})
    reporter.thread.announcer.refresh_hello()
    sender.address = type(collector.address)(port=1)  # nobody there: frames queue up
    sender.enqueue(encode(Window(run_id="script-123", rank=0, seq=1, t0=0, t1=0.5)))
    reporter.side.facts.update({"run_id": "job", "rank": 1, "world_size": 2})
    reporter.thread.announcer.refresh_hello()
    sender.address = collector.address
    assert wait_for(lambda: (sender.pump(time.monotonic() + 60), sender.idle)[1])
    sender.enqueue(encode(Window(run_id="job", rank=1, seq=1, t0=1, t1=1.5, steps=2, step_total=2)))
    assert wait_for(lambda: (sender.pump(), window_count(collector) == 1)[1])
    snap = snapshot_of(collector)
    assert [(v.run_id, v.rank) for v in snap.all_ranks()] == [("job", 1)]
    assert snap.rejected == ()
    sender.close()


def test_the_reporter_will_not_use_a_default_socket_folder_others_can_read(tmp_path, monkeypatch) -> None:
    from gputop.address import default_socket_path, resolve
    from gputop.reporter.sender import Sender

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("GPUTOP_PORT", raising=False)
    monkeypatch.delenv("GPUTOP_SOCKET", raising=False)
    folder = default_socket_path().parent
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(default_socket_path()))  # someone listens there
    listener.listen(1)
    sender = Sender(resolve(), backlog_frames=10)
    sender.pump()
    assert not sender.connected
    assert "readable by other users" in sender.refused
    listener.close()


def test_ddps_exchange_is_a_collective_from_its_loggers_figures() -> None:
    """DDP's all-reduce runs in C++, out of the tap's sight: its logger's per-iteration figures make its row."""
    from gputop.protocol import CollectiveTimes
    from gputop.reporter.window import ddp_exchange

    fields = {"comm_s": 0.004, "overlap_s": 0.001, "ddp_steps": 5, "timed_steps": 6}
    row = ddp_exchange(fields, buckets=3, gradient_bytes=1000, group="world", ranks=8)
    assert isinstance(row, CollectiveTimes)
    assert msgspec.structs.astuple(row) == (
        "all_reduce", "world", 15, 5000, pytest.approx(0.02), pytest.approx(0.015), 8
    )  # fmt: skip
    assert ddp_exchange(fields, buckets=None, gradient_bytes=1000, group="world") is None  # not built yet: no row
    assert ddp_exchange({"steps": 4}, buckets=3, gradient_bytes=1000, group="world") is None  # not timed


def test_a_collective_tap_that_cannot_install_is_named_once_as_an_error_event(collector) -> None:
    """The job trains on untimed collectives, and the dashboard hears why (it once dropped the event)."""
    pytest.importorskip("torch")
    code = f"""
        import os, torch, torch.distributed as dist
        import gputop
        from gputop.reporter.collectives import CollectiveTap

        def refuse(self):
            raise RuntimeError("no tap here")

        CollectiveTap.install = refuse
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="{free_port()}", RANK="0", WORLD_SIZE="1")
        dist.init_process_group("gloo")
        model = torch.nn.Linear(4, 4)
        gputop.watch(model)
        for _ in range(3):
            model(torch.ones(2, 4)).sum().backward()
            gputop.step()
        dist.destroy_process_group()
    """
    result = run_script(code, collector.address.port)
    assert result.returncode == 0, result.stderr

    def errors() -> list[str]:
        return [e.message for r in snapshot_of(collector).all_ranks() for e in r.events if e.kind == "error"]

    assert wait_for(lambda: any(m.startswith("collectives: RuntimeError: no tap here") for m in errors())), errors()


def test_the_stack_sampler_follows_the_thread_the_model_is_watched_from(collector) -> None:
    """A loader tracked on another thread first builds the reporter there; the stacks are the training thread's."""
    import threading

    torch = pytest.importorskip("torch")
    from gputop.reporter.reporter import Reporter

    built: list[Reporter] = []
    elsewhere = threading.Thread(target=lambda: built.append(Reporter(collector.address)))
    elsewhere.start()
    elsewhere.join()
    (reporter,) = built
    sampler = reporter.thread.stacks.sampler
    assert sampler is not None and sampler.thread_ident == elsewhere.ident
    reporter.attach_model(torch.nn.Linear(2, 2))
    assert sampler.thread_ident == threading.get_ident()
    reporter.thread.sender.close()
