"""How long a rank blocked in a collective takes to die of SIGTERM, and whether its bye arrives (issue #48).

A 2-rank DDP job on gloo over two network namespaces (tests/support/netns.py: needs root), each rank on a
host of its own, reporting to ``gputop record`` on a third over TCP with a token.  Once the job steps, node-b's
link goes down (a lost node, no reset reaching its peer): node-a's rank blocks in DDP's all-reduce, in C++,
and its reporter thread in the DDP probe's read, on DDP's lock.  Then node-a's rank gets SIGTERM, as from
``scancel`` or torchrun: the figure is the time from the signal to its end, its wait status, and whether the
recording holds its bye.  ``--tree`` runs another checkout's gputop (``/work/main``: before a change).

Run (root): .venv/bin/python benchmarks/sigterm_death.py [--rounds 3] [--tree PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOKEN = "sigterm-benchmark-token"
JOB = REPO / "tests" / "support" / "jobs" / "ddp_job.py"


def one_round(tree: Path, folder: Path, round_no: int) -> tuple[float | None, int | None, bool]:
    """(seconds from SIGTERM to the rank's end or None, its wait status, whether its bye was recorded)."""
    sys.path.insert(0, str(REPO))
    from tests.support.netns import Cluster

    cluster = Cluster(["head", "node-a", "node-b"], prefix=f"sgt{os.getpid() % 10000}{round_no}")
    cluster.create()
    head, node_a, node_b = cluster.hosts
    out = folder / f"round{round_no}.jsonl"
    base = {**os.environ, "PYTHONPATH": str(tree), "GPUTOP_TOKEN": TOKEN, "OMP_NUM_THREADS": "1"}
    try:
        recorder = subprocess.Popen(
            ["ip", "netns", "exec", head.netns, sys.executable, "-m", "gputop", "record", "--listen",
             f"{head.address}:32300", "--seconds", "300", "-o", str(out)],
            env=base, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        ranks = []
        for rank, host in enumerate((node_a, node_b)):
            env = {**base, "MASTER_ADDR": node_a.address, "MASTER_PORT": "32310", "RANK": str(rank),
                   "WORLD_SIZE": "2", "LOCAL_RANK": "0", "GLOO_SOCKET_IFNAME": "eth0",
                   "GPUTOP_ADDR": f"{head.address}:32300", "GPUTOP_WINDOW_S": "0.5"}  # fmt: skip
            ranks.append(subprocess.Popen(["ip", "netns", "exec", host.netns, sys.executable, str(JOB), "--steps",
                                           "100000000", "--delay-ms", "10"], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
        time.sleep(8.0)  # started and stepping
        subprocess.run(["ip", "-n", node_b.netns, "link", "set", "eth0", "down"], check=True)
        time.sleep(5.0)  # node-a's rank blocked in the all-reduce, its reporter on DDP's lock
        sent = time.monotonic()
        ranks[0].send_signal(signal.SIGTERM)
        try:
            status: int | None = ranks[0].wait(40)
            took_s: float | None = time.monotonic() - sent
        except subprocess.TimeoutExpired:
            status, took_s = None, None
        for proc in ranks:
            proc.kill()
            proc.wait()
        recorder.send_signal(signal.SIGINT)
        recorder.wait(30)
        lines = out.read_text().splitlines() if out.exists() else []
        byes = [json.loads(line) for line in lines if '"type":"bye"' in line]
        said = any(b.get("rank") == 0 and b.get("how") == "signal" for b in byes)
        return took_s, status, said
    finally:
        cluster.destroy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", type=Path, default=REPO, help="the checkout whose gputop the ranks import")
    args = parser.parse_args()
    took = []
    with tempfile.TemporaryDirectory() as folder:
        for round_no in range(args.rounds):
            took_s, status, said = one_round(args.tree, Path(folder), round_no)
            shown = "still alive 40 s after SIGTERM" if took_s is None else f"dead {took_s:.2f} s after SIGTERM"
            print(f"round {round_no + 1}: {shown}, wait status {status}, bye {'recorded' if said else 'none'}")
            if took_s is not None:
                took.append(took_s)
    if took:
        print(f"{args.tree}: median {statistics.median(took):.2f} s, worst {max(took):.2f} s over {len(took)} rounds")


if __name__ == "__main__":
    main()
