"""The stack sampler where torch and real processes are: torch's own frames, a gloo barrier, a reporter's collector.

The threads sampled here block in torch's optimizer, autograd, a watched
model's forward, a DataLoader and a gloo barrier; the rest of the sampler
(plain threads, tallies, sending) is in tests/unit/test_stack_sampler.py.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

from gputop.collect.server import Collector
from gputop.protocol import StackFrame, decode
from gputop.reporter import stacks
from tests.support.collectors import snapshot_of, wait_for
from tests.support.processes import free_port, needs_torch
from tests.support.sampling import blocked, sampled

THIS_FILE = "tests/integration/test_stack_sampler.py"  # as the sampler shows it: relative to the working folder


def line_of(text: str) -> int:
    """The line of this file holding ``text`` (where a thread below blocks)."""
    return next(n for n, line in enumerate(Path(__file__).read_text().splitlines(), 1) if text in line)


BLOCKED_JOB = """
import sys, threading, gputop
gputop.watch()
lock = threading.Lock()
lock.acquire()

def wait_for_lock():
    lock.acquire(timeout=float(sys.argv[1]))  # blocked here

wait_for_lock()
"""


def _run(tmp_path: Path, seconds: float, **env: str) -> subprocess.Popen[str]:
    """A script (a file: code from ``python -c`` is nobody's file) that blocks on a lock for ``seconds``."""
    import os

    script = tmp_path / "blocked_job.py"
    script.write_text(BLOCKED_JOB)
    full = {**os.environ, **env}
    return subprocess.Popen([sys.executable, str(script), str(seconds)], env=full, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip


class TestWithACollector:
    def test_a_collector_that_accepts_stacks_sees_where_the_training_thread_blocks(
        self, collector: Collector, tmp_path: Path
    ) -> None:
        job = _run(tmp_path, 4, GPUTOP_PORT=str(collector.address.port))
        try:
            assert wait_for(lambda: any(v.stacks for v in snapshot_of(collector).all_ranks()), timeout_s=20)
            (view,) = snapshot_of(collector).all_ranks()
            assert view.hello.sends == ("stacks",)
            latest = view.latest_stacks
            assert latest is not None and latest.samples >= 10, latest  # 20 a second over about a second
            line = BLOCKED_JOB.splitlines().index("    lock.acquire(timeout=float(sys.argv[1]))  # blocked here") + 1
            assert latest.now == StackFrame("outside", "blocked_job.py", line, "wait_for_lock")
        finally:
            out, _ = job.communicate(timeout=60)
        assert job.returncode == 0, out

    def test_gputop_stacks_0_sends_none(self, collector: Collector, tmp_path: Path) -> None:
        job = _run(tmp_path, 2.5, GPUTOP_PORT=str(collector.address.port), GPUTOP_STACKS="0")
        out, _ = job.communicate(timeout=60)
        assert job.returncode == 0, out
        (view,) = snapshot_of(collector).all_ranks()
        assert view.windows and view.stacks == () and view.hello.sends == ()

    def test_a_collector_that_never_accepts_stacks_is_never_sent_one(self, tmp_path: Path) -> None:
        """A collector from before stacks closes a connection on a type it does not know: it must never see one."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # no handshake on a Unix socket
        listener.bind(str(tmp_path / "old.sock"))
        listener.listen()
        listener.settimeout(30)
        job = _run(tmp_path, 3, GPUTOP_SOCKET=str(tmp_path / "old.sock"))
        try:
            conn, _ = listener.accept()
            conn.settimeout(10)
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
        finally:
            out, _ = job.communicate(timeout=60)
            listener.close()
        types = [decode(line).TYPE for line in data.splitlines() if line.strip()]
        assert job.returncode == 0, out
        assert "window" in types and "bye" in types and "stacks" not in types, types


@needs_torch
class TestTorchPhases:
    """The markers on torch's own frames: optimizer, backward, the watched model's forward, the DataLoader."""

    def test_a_hook_inside_optimizer_step_is_the_optimizer(self) -> None:
        import torch

        def loop(release: threading.Event) -> None:
            param = torch.nn.Parameter(torch.ones(2))
            optimizer = torch.optim.SGD([param], lr=0.1)

            def hook(*_: Any) -> None:
                release.wait()  # blocked inside Optimizer.step

            optimizer.register_step_pre_hook(hook)
            param.grad = torch.ones(2)
            optimizer.step()

        with blocked(loop) as thread:
            now = sampled(thread).now
        assert now is not None and now.where == "optimizer" and now.file == THIS_FILE, now

    def test_a_custom_backward_is_the_backward(self) -> None:
        import torch

        class Blocking(torch.autograd.Function):
            release: threading.Event

            @staticmethod
            def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
                return x * 2

            @staticmethod
            def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
                Blocking.release.wait()  # inside loss.backward()
                return grad * 2

        def loop(release: threading.Event) -> None:
            Blocking.release = release
            Blocking.apply(torch.ones(2, requires_grad=True)).sum().backward()

        with blocked(loop) as thread:
            now = sampled(thread).now
        assert now == StackFrame("backward", THIS_FILE, line_of("# inside loss.backward()"), "Blocking.backward")

    def test_the_watched_models_forward_is_the_forward(self) -> None:
        import torch

        class Net(torch.nn.Module):
            release: threading.Event

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                self.release.wait()  # inside the model's forward
                return x

        model = torch.nn.parallel.DataParallel(Net())  # a wrapper, as DDP is: the inner forward counts too
        model.module.release = threading.Event()

        def loop(release: threading.Event) -> None:
            model.module.release = release
            model(torch.ones(1))

        with blocked(loop) as thread:
            now = sampled(thread, forwards=stacks.forward_codes(model)).now
            without = sampled(thread).now
        assert now == StackFrame("forward", THIS_FILE, line_of("# inside the model's forward"), "Net.forward")
        assert without is not None and without.where == "outside"  # not the watched model's: no marker

    def test_a_dataloader_fetch_is_the_loader_with_the_users_dataset(self) -> None:
        import torch

        class Slow(torch.utils.data.Dataset[int]):
            def __init__(self, release: threading.Event) -> None:
                self.release = release

            def __len__(self) -> int:
                return 4

            def __getitem__(self, index: int) -> int:
                self.release.wait()  # reading a sample
                return index

        def loop(release: threading.Event) -> None:
            for _ in torch.utils.data.DataLoader(Slow(release), batch_size=2):
                pass

        with blocked(loop) as thread:
            now = sampled(thread).now
        assert now == StackFrame("loader", THIS_FILE, line_of("# reading a sample"), "Slow.__getitem__")

    def test_a_rank_waiting_in_a_gloo_barrier_is_in_a_collective(self, tmp_path: Path) -> None:
        """Two real processes: rank 1 joins the barrier 3 s late; rank 0's thread waits in it meanwhile."""
        script = tmp_path / "barrier_job.py"
        script.write_text(
            textwrap.dedent(
                """
                import json, sys, threading, time
                import torch.distributed as dist
                from gputop.reporter.stacks import StackSampler

                rank, port = int(sys.argv[1]), sys.argv[2]
                dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}")
                if rank == 1:
                    time.sleep(3)
                    dist.barrier()
                else:
                    def wait_for_the_others():
                        dist.barrier()

                    thread = threading.Thread(target=wait_for_the_others)
                    thread.start()
                    time.sleep(1)
                    sampler = StackSampler(thread.ident)
                    for _ in range(5):
                        sampler.sample()
                    now = sampler.take("run", 0, time.time()).now
                    print(json.dumps([now.where, now.file, now.line, now.function]), flush=True)
                    thread.join()
                dist.destroy_process_group()
                """
            )
        )
        port = str(free_port())
        cwd = str(Path(__file__).resolve().parents[2])
        late = subprocess.Popen([sys.executable, str(script), "1", port], cwd=cwd)
        try:
            out = subprocess.run([sys.executable, str(script), "0", port], cwd=cwd, capture_output=True, text=True,
                                 timeout=120)  # fmt: skip
        finally:
            late.wait(60)
        assert out.returncode == 0, out.stderr
        line = script.read_text().splitlines().index("        dist.barrier()") + 1  # in wait_for_the_others
        assert json.loads(out.stdout) == ["collective", "barrier_job.py", line, "wait_for_the_others"]
