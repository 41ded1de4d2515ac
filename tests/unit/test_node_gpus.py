"""Other hosts' GPUs: the node sampler's frames, the join across hosts, recordings, the exporter's labels.

A rank on another machine has no GPU in the collector's own NVML readings; its
host's node sampler (``gputop.node``) sends them.  UUIDs are unique across
machines, indices and PIDs are not: these tests hold the join to that.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from gputop import auth
from gputop.address import Address
from gputop.collect import recording
from gputop.collect.gpu.nvml import Nvml
from gputop.collect.gpu.sampler import GpuSampler
from gputop.collect.server import Collector
from gputop.collect.store import NODE_GPU_STALE_S, Store
from gputop.export.metrics import families
from gputop.model.figures import summarize
from gputop.model.gpu_summary import summarize_gpus
from gputop.model.join import join_ranks_to_gpus
from gputop.model.samples import GpuProcess, GpuReading, GpuSample
from gputop.node.sampler import Link, gpus_frame, run
from gputop.protocol import MAX_FRAME_BYTES, Gpus, Hello, encode
from gputop.reporter import node_sampler
from gputop.reporter.sender import Sender
from tests.support.collectors import TOKEN, wait_for
from tests.support.nvml_standin import Gpu, Process, Scenario, env_for, use_in_process

REPO = Path(__file__).resolve().parents[2]


def reading(index: int, uuid: str, *pids: int, util: float = 50.0) -> GpuReading:
    return GpuReading(
        index=index, uuid=uuid, util_pct=util, processes=tuple(GpuProcess(pid=p, used_bytes=1 << 30) for p in pids)
    )


def two_hosts() -> Store:
    """The collector's machine "head" with GPU 0; node-a with GPUs 0 and 1 (indices repeat across hosts).

    Ranks: r0 on head by UUID; r1 on node-a by UUID; r2 on node-a with no UUID (PID fallback);
    pid 300 is r0's on head and, on node-a, someone else's process.
    """
    store = Store()
    for hello in (
        Hello(run_id="job", rank=0, hostname="head", pid=300, device_uuid="GPU-head0"),
        Hello(run_id="job", rank=1, hostname="node-a", pid=401, device_uuid="gpu-NODEA1"),
        Hello(run_id="job", rank=2, hostname="node-a", pid=402),
    ):
        store.ingest(hello, now=0.0)
    store.add_gpu(GpuSample(t=0.0, gpus=(reading(0, "GPU-head0", 300),)))
    store.add_node_gpu(
        GpuSample(t=0.0, hostname="node-a", gpus=(reading(0, "GPU-nodea0", 402, 300), reading(1, "GPU-nodea1", 401)))
    )
    return store


class TestJoinAcrossHosts:
    def test_ranks_join_their_own_hosts_gpus_by_uuid_and_by_pid_only_within_the_host(self) -> None:
        assignments = join_ranks_to_gpus(two_hosts().snapshot(1.0))
        where = {(a.hostname, a.gpu.index): sorted(r.rank for r in a.ranks) for a in assignments}
        assert where == {("", 0): [0], ("node-a", 0): [2], ("node-a", 1): [1]}

    def test_foreign_processes_are_counted_per_host_even_when_a_pid_matches_a_rank_elsewhere(self) -> None:
        assignments = join_ranks_to_gpus(two_hosts().snapshot(1.0))
        foreign = {(a.hostname, a.gpu.index): [p.pid for p in a.unobserved] for a in assignments}
        # pid 300 is rank 0's on head; on node-a it is some other process.
        assert foreign == {("", 0): [], ("node-a", 0): [300], ("node-a", 1): []}

    def test_a_gpu_the_collector_reads_itself_is_listed_once(self) -> None:
        store = two_hosts()
        store.add_node_gpu(GpuSample(t=0.5, hostname="container", gpus=(reading(0, "GPU-HEAD0"),)))
        assignments = join_ranks_to_gpus(store.snapshot(1.0))
        assert [a.hostname for a in assignments].count("container") == 0
        assert sum(1 for a in assignments for r in a.ranks if r.rank == 0) == 1

    def test_a_silent_hosts_gpus_leave_the_live_join_but_stay_in_its_history(self) -> None:
        store = two_hosts()
        later = store.snapshot(NODE_GPU_STALE_S + 1)
        assert {a.hostname for a in join_ranks_to_gpus(later)} == {""}
        assert len(later.node_gpu_history["node-a"]) == 1

    def test_figures_give_a_remote_rank_its_gpu_and_its_utilization(self) -> None:
        figures = summarize(two_hosts().snapshot(1.0))
        r1 = figures.rank("job:1")
        assert r1 is not None and r1.gpu is not None and r1.gpu.uuid == "GPU-nodea1"
        assert r1.gpu_util_pct == 50.0


class TestRecordingAndReport:
    def test_a_recording_keeps_each_hosts_gpus_and_the_report_joins_them(self, tmp_path: Path) -> None:
        path = tmp_path / "two-hosts.jsonl"
        recorder = recording.Recorder(path, source="test")
        store = two_hosts()
        snap = store.snapshot(1.0)
        for rank in snap.all_ranks():
            recorder.message(rank.hello, 0.0)
        for sample in snap.gpu_samples():
            recorder.sample(sample)
        recorder.close()
        kinds = [json.loads(line)["type"] for line in path.read_text().splitlines()[1:]]
        assert kinds.count("gpu") == 1 and kinds.count("node_gpu") == 1  # an old gputop skips node_gpu lines

        loaded, last_t = recording.load(path)
        again = loaded.snapshot(last_t, history=None)
        summary = summarize_gpus(list(again.gpu_samples()), again)
        by_gpu = {(g["hostname"], g["index"]): g for g in summary["gpus"]}
        assert set(by_gpu) == {("", 0), ("node-a", 0), ("node-a", 1)}
        assert [r["rank"] for r in by_gpu[("node-a", 1)]["ranks"]] == [1]
        assert [p["pid"] for p in by_gpu[("node-a", 0)]["unobserved"]] == [300]

    def test_a_recording_from_before_node_samplers_reads_as_the_collectors_own(self, tmp_path: Path) -> None:
        path = tmp_path / "old.jsonl"
        gpu = {"type": "gpu", "t": 1.0, "gpus": [{"index": 0, "uuid": "GPU-x", "util_pct": 10.0}]}
        path.write_text(json.dumps({"type": "recording", "version": 1}) + "\n" + json.dumps(gpu) + "\n")
        store, last_t = recording.load(path)
        snap = store.snapshot(last_t)
        assert snap.gpu is not None and snap.gpu.hostname == "" and snap.node_gpu_history == {}


def test_prometheus_gpu_series_carry_the_host_that_read_the_gpu() -> None:
    figures = summarize(two_hosts().snapshot(1.0))
    (util,) = [f for f in families(figures, [], gpu_hostname="head") if f.spec.name == "gputop_gpu_utilization_ratio"]
    host = util.spec.labels.index("Hostname")
    uuid = util.spec.labels.index("UUID")
    assert {(labels[uuid], labels[host]) for labels, _ in util.samples} == {
        ("GPU-head0", "head"),
        ("GPU-nodea0", "node-a"),
        ("GPU-nodea1", "node-a"),
    }


def test_a_sample_too_big_for_one_frame_goes_without_its_process_lists() -> None:
    many = tuple(GpuProcess(pid=p, used_bytes=1 << 30, name="x" * 60) for p in range(400))
    sample = GpuSample(t=1.0, gpus=tuple(GpuReading(index=i, uuid=f"GPU-{i}", processes=many) for i in range(8)))
    frame = gpus_frame(sample, "node-a")
    assert len(frame) <= MAX_FRAME_BYTES
    sent = json.loads(frame)["sample"]["gpus"][0]
    assert "processes" not in sent and "frame limit" in sent["na"]["processes"]


# -- the collector's side: real sockets ---------------------------------------------------------


@pytest.fixture
def sampler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> GpuSampler:
    """Two GPUs through the real nvidia-ml-py over the stand-in libnvidia-ml."""
    gpus = [Gpu(uuid="GPU-aaaa", processes=[Process(pid=1)]), Gpu(uuid="GPU-bbbb", util_pct=90)]
    use_in_process(monkeypatch, Scenario(gpus).write(tmp_path / "nvml-scenario"))
    return GpuSampler(Nvml())


def test_a_node_sampler_with_the_token_reaches_the_store_under_its_host(
    guarded: Collector, sampler: GpuSampler
) -> None:
    link = Link(guarded.address, auth.Security(token=TOKEN), say=lambda line: None)
    for _ in range(3):
        assert wait_for(lambda: link.send(gpus_frame(sampler.sample(), "node-a"), time.monotonic()), timeout_s=5)
    assert wait_for(lambda: len(guarded.store.snapshot(time.time()).node_gpu_history.get("node-a", ())) == 3)
    latest = guarded.store.snapshot(time.time()).node_gpus[0]
    assert latest.hostname == "node-a" and [g.uuid for g in latest.gpus] == ["GPU-aaaa", "GPU-bbbb"]
    assert abs(latest.t - time.time()) < 5  # stamped with the collector's clock
    link.close()


def test_a_node_sampler_without_the_token_is_refused_and_says_so_once(guarded: Collector, sampler: GpuSampler) -> None:
    said: list[str] = []
    link = Link(guarded.address, auth.Security(token="wrong"), say=said.append)
    assert not link.send(gpus_frame(sampler.sample(), "node-a"), time.monotonic())
    assert not link.send(gpus_frame(sampler.sample(), "node-a"), time.monotonic() + 10)  # backs off, no retry yet
    assert len(said) == 1 and "wrong token" in said[0]
    assert wait_for(lambda: guarded.store.token_refusals == 1, timeout_s=5)
    assert guarded.store.snapshot(time.time()).node_gpu_history == {}


@pytest.mark.parametrize(
    ("sample", "why"),
    [
        ({"t": 1.0, "gpus": [{"index": 0, "uuid": "GPU-a", "util_pct": "high"}]}, "Expected `float | null`"),
        ({"t": 1.0, "gpus": [{"uuid": "GPU-a"}]}, "missing required field `index`"),
        ({"gpus": []}, "missing required field `t`"),
    ],
)
def test_a_malformed_gpus_frame_closes_its_connection_not_the_collector(
    guarded: Collector, sample: dict[str, object], why: str, sampler: GpuSampler
) -> None:
    with socket.create_connection(("127.0.0.1", guarded.address.port or 0), timeout=5) as raw:
        challenge = auth.decode_frame(raw.makefile("rb").readline())
        assert isinstance(challenge, auth.Challenge)
        raw.sendall(auth.encode_frame(auth.answer(challenge, TOKEN)))
        raw.sendall(encode(Gpus(hostname="node-a", t=1.0, sample=sample)))
        assert wait_for(lambda: any(why in r for r in guarded.store.snapshot(time.time()).rejected), timeout_s=5)
    assert guarded.store.snapshot(time.time()).node_gpu_history == {}
    good = Link(guarded.address, auth.Security(token=TOKEN), say=lambda line: None)
    assert good.send(gpus_frame(sampler.sample(), "node-b"), time.monotonic())  # the collector lives on
    assert wait_for(lambda: "node-b" in guarded.store.snapshot(time.time()).node_gpu_history)
    good.close()


def test_the_loop_sends_every_interval_until_stopped(guarded: Collector, sampler: GpuSampler) -> None:
    import threading

    stop = threading.Event()
    link = Link(guarded.address, auth.Security(token=TOKEN), say=lambda line: None)
    worker = threading.Thread(target=run, args=(link, sampler, "node-a"), kwargs={"interval_s": 0.1,
                              "stop": stop})  # fmt: skip
    worker.start()
    try:
        assert wait_for(lambda: len(guarded.store.snapshot(time.time()).node_gpu_history.get("node-a", ())) >= 3)
    finally:
        stop.set()
        worker.join(5)
    assert not worker.is_alive()


# -- the rank's side: when it starts one, and that it dies with the rank ------------------------


class TestWhenARankStartsOne:
    @pytest.mark.parametrize(
        ("env", "local_rank", "remote", "expected"),
        [
            ("", 0, True, True),  # auto: local rank 0 reporting to another machine
            ("", 0, False, False),  # auto: the collector reads this machine's GPUs itself
            ("", 1, True, False),  # one per host: local rank 0's
            ("", 0, None, False),  # not connected yet: not known
            ("off", 0, True, False),
            ("0", 0, True, False),
            ("on", 0, False, True),  # a collector here that cannot see the GPUs (a container)
            ("on", 3, False, False),
        ],
    )
    def test_the_rule(self, env: str, local_rank: int, remote: bool | None, expected: bool) -> None:
        chosen = node_sampler.mode({node_sampler.MODE_ENV: env} if env else {})
        assert node_sampler.wanted(chosen, local_rank, remote) is expected

    def test_a_loopback_connection_is_not_another_machine(self, guarded: Collector) -> None:
        sender = Sender(guarded.address, backlog_frames=10, security=auth.Security(token=TOKEN))
        sender.set_hello(encode(Hello(run_id="r", rank=0)))
        try:
            assert wait_for(lambda: (sender.pump(), sender.connected)[1], timeout_s=5)
            assert sender.remote_link is False
        finally:
            sender.close()

    def test_the_command_carries_the_collector_and_the_rank(self) -> None:
        argv = node_sampler.command(Address(host="10.0.0.1", port=29470), parent_pid=1234)
        assert argv[1:] == ["-m", "gputop.node", "--parent-pid", "1234", "--addr", "10.0.0.1:29470"]
        assert node_sampler.command(Address(host="fe80::1", port=9), 1)[-1] == "[fe80::1]:9"


RANK = textwrap.dedent(
    """
    import sys, time
    from gputop.address import Address
    from gputop.reporter.node_sampler import NodeSamplerChild
    child = NodeSamplerChild()
    child.start(Address(host="127.0.0.1", port=int(sys.argv[1])), parent_pid=__import__("os").getpid())
    print(child.process.pid, round(child.spawn_s * 1e3, 2), flush=True)
    time.sleep(600)
    """
)


def test_the_node_sampler_dies_with_the_rank_that_started_it(tmp_path: Path) -> None:
    """SIGKILL the rank (no atexit, no reporter shutdown): the sampler's lifeline ends it."""
    scenario = Scenario([]).write(tmp_path / "nvml-scenario")  # a node whose NVML sees no GPU
    env = {**os.environ, "PYTHONPATH": str(REPO), **env_for(scenario)}
    rank = subprocess.Popen([sys.executable, "-c", RANK, "1"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert rank.stdout is not None
        child_pid = int(rank.stdout.readline().split()[0])
        child = psutil.Process(child_pid)
        assert wait_for(lambda: "gputop.node" in " ".join(child.cmdline()), timeout_s=10)
        assert child.ppid() == rank.pid
        assert os.getsid(child_pid) == child_pid  # a session of its own: a terminal's Ctrl-C is the rank's
        rank.send_signal(signal.SIGKILL)
        rank.wait(10)
        assert wait_for(lambda: not psutil.pid_exists(child_pid) or child.status() == psutil.STATUS_ZOMBIE, 10), (
            f"the node sampler {child_pid} outlived its rank"
        )
    finally:
        rank.kill()
        rank.wait()


def test_findings_about_another_hosts_gpu_name_the_host() -> None:
    """Indices repeat across hosts: "GPU 0" alone would point at the wrong machine."""
    from gputop.diagnose import diagnose

    store = two_hosts()
    store.add_gpu(GpuSample(t=0.5, unavailable="NVML unavailable: no driver"))  # a head node without GPUs
    findings = diagnose(summarize(store.snapshot(1.0)))
    (stranger,) = [f for f in findings if f.cause == "unobserved" and f.gpus]
    assert stranger.title.startswith("node-a GPU 0: pid 300") and stranger.hostname == "node-a"
    assert not any(f.title.startswith("No GPU data") for f in findings)  # the nodes' GPUs are data


def test_many_hosts_keep_a_shorter_history_each_so_memory_stays_flat() -> None:
    from gputop.collect.store import MIN_NODE_SAMPLES, NODE_SAMPLE_BUDGET

    store = Store()
    for i in range(200):
        store.add_node_gpu(GpuSample(t=float(i), hostname="node-000", gpus=(reading(0, "GPU-0"),)))
    assert len(store.snapshot(200.0).node_gpu_history["node-000"]) == 200  # alone, it keeps 10 minutes
    hosts = NODE_SAMPLE_BUDGET // MIN_NODE_SAMPLES
    for h in range(1, hosts):
        for i in range(50):
            store.add_node_gpu(GpuSample(t=200.0 + i, hostname=f"node-{h:03d}", gpus=(reading(0, f"GPU-{h}"),)))
    kept = store.snapshot(250.0).node_gpu_history
    assert len(kept) == hosts and max(len(h) for h in kept.values()) == MIN_NODE_SAMPLES
    assert kept["node-000"][-1].t == 199.0  # the newest are the ones kept


def test_an_agent_started_by_hand_says_once_that_it_cannot_reach_the_collector(
    guarded: Collector, sampler: GpuSampler
) -> None:
    said: list[str] = []
    port = guarded.address.port or 0
    guarded.stop()  # nobody listens there now
    link = Link(Address(host="127.0.0.1", port=port), auth.Security(token=TOKEN), say=said.append,
                say_unreachable=True)  # fmt: skip
    sample = sampler.sample()
    for attempt in range(3):
        assert not link.send(gpus_frame(sample, "node-a"), time.monotonic() + 100 * attempt)
    assert len(said) == 1 and said[0].startswith(f"cannot reach tcp://127.0.0.1:{port}"), said


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--listen", "127.0.0.1:1"], "where this node's ranks report to an exporting agent: add --prometheus"),
        (["--prometheus", "127.0.0.1:0", "--addr", "127.0.0.1:1"], "with --prometheus the agent is the collector"),
    ],
)
def test_the_agents_two_roles_are_not_mixed_up(args: list[str], said: str) -> None:
    """Sender of a node's GPUs (--addr) or the node's exporter (--prometheus, its ranks reporting to it): a flag
    of the other role is a one-line usage error, not an agent quietly doing something else."""
    done = subprocess.run([sys.executable, "-m", "gputop", "agent", *args], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 2 and said in done.stderr and done.stderr.count("\n") == 1, done.stderr
