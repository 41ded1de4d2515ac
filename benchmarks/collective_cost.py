"""What the collective tap costs the training thread, per collective: off, on, and against no tap at all.

One process, a one-rank gloo group.  Two measurements:

- **the wrapper alone**: the tap's wrappers around a stand-in collective that does nothing, so the
  difference to calling the stand-in directly is gputop's own work per call, without gloo's noise
  (~µs per call, varying by more than the wrapper costs);
- **a real all_reduce** of a 4-byte tensor with no tap, the tap installed but off (no collector
  listening), and on: the end-to-end view, for the record.

Each figure is the median of ``--rounds`` rounds of ``--calls`` calls, the three modes interleaved; ``--best``
takes each mode's fastest round instead, the figure a shared machine's noise cannot inflate (to compare two
versions of the tap: run it on each, alternately).

    .venv/bin/python benchmarks/collective_cost.py [--calls 20000] [--rounds 15] [--best]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from gputop.reporter.clock import StepClock
from gputop.reporter.collective_calls import Where
from gputop.reporter.collectives import CollectiveTap


def per_call_ns(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / calls


def wrapper_alone(calls: int, rounds: int, pick: Callable[[list[float]], float]) -> dict[str, float]:
    """The wrapper's own cost around a collective that returns at once (a blocking one: the common case)."""
    tensor = torch.ones(1)

    def all_reduce(tensor: torch.Tensor, op: Any = None, group: Any = None, async_op: bool = False) -> None:
        return None

    tap = CollectiveTap(StepClock())
    # As all_reduce is wrapped: in dynamo's table of collectives, so the wrapper does not ask whether it traces.
    wrapped = tap._wrap(all_reduce, "all_reduce", Where.of(all_reduce, "tensor"), traced=False)
    modes = {"direct": lambda: all_reduce(tensor), "off": lambda: wrapped(tensor), "on": lambda: wrapped(tensor)}
    times: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(rounds):
        for name, fn in modes.items():
            tap.on = name == "on"
            times[name].append(per_call_ns(fn, calls))
            tap.records.clear()
    return {name: pick(values) for name, values in times.items()}


def real_all_reduce(calls: int, rounds: int, pick: Callable[[list[float]], float]) -> dict[str, float]:
    tensor = torch.ones(1)
    tap = CollectiveTap(StepClock())
    times: dict[str, list[float]] = {"no tap": [], "off": [], "on": []}
    for _ in range(rounds):
        for name in times:
            if name == "no tap":
                tap.uninstall()
            elif not tap._undo:
                tap.install()
            tap.on = name == "on"
            times[name].append(per_call_ns(lambda: dist.all_reduce(tensor), calls))
            tap.records.clear()
    tap.uninstall()
    return {name: pick(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--best", action="store_true", help="each mode's fastest round, not the median")
    args = parser.parse_args()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    pick, how = (min, "best") if args.best else (statistics.median, "median")
    alone = wrapper_alone(args.calls, args.rounds, pick)
    print(f"wrapper alone, ns per call ({how} of {args.rounds} x {args.calls}):")
    for name, ns in alone.items():
        print(f"  {name:<8} {ns:8.0f}")
    print(f"  gputop's own: off {alone['off'] - alone['direct']:.0f} ns, on {alone['on'] - alone['direct']:.0f} ns")
    real = real_all_reduce(args.calls // 4, args.rounds, pick)
    print(f"dist.all_reduce of 4 bytes, one rank, gloo, ns per call ({how} of {args.rounds} x {args.calls // 4}):")
    for name, ns in real.items():
        print(f"  {name:<8} {ns:8.0f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
