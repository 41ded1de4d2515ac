"""Which rank the others waited for, step by step: chronic, rotating, or ties within the job's own jitter."""

from __future__ import annotations

import random
from collections.abc import Sequence

import msgspec
import pytest

from gputop.combine import merge_windows, ready_steps_kept
from gputop.model.slowest import SLOWEST_LINE_FRAC, slowest_ranks
from gputop.protocol import READY_STEPS_KEPT, Window, decode, encode
from gputop.reporter.clock import StepMark, input_numel
from gputop.reporter.window import step_fields

STEP_S = 0.040
PER_WINDOW = 10


def windows(
    rank: int,
    ready_s: Sequence[float],
    *,
    every: int = 1,
    forward_s: Sequence[float] = (),
    numel: Sequence[int] = (),
) -> list[Window]:
    """A rank's windows of PER_WINDOW steps each, steps numbered from 1, readiness kept for every ``every``th.

    ``forward_s``: each step's last forward's length, sent beside its readiness (none: an older reporter's);
    ``numel``: the elements of that forward's input.
    """
    out = []
    for seq, start in enumerate(range(0, len(ready_s), PER_WINDOW)):
        numbers = [n for n in range(start + 1, min(start + PER_WINDOW, len(ready_s)) + 1) if n % every == 0]
        out.append(
            Window(run_id="r", rank=rank, seq=seq, t0=seq * 0.4, t1=seq * 0.4 + 0.4, steps=PER_WINDOW,
                   step_total=start + PER_WINDOW, ready_step_numbers=tuple(numbers),
                   ready_s=tuple(ready_s[n - 1] for n in numbers),
                   ready_forward_s=tuple(forward_s[n - 1] for n in numbers) if forward_s else (),
                   ready_input_numel=tuple(numel[n - 1] for n in numbers) if numel else ())
        )  # fmt: skip
    return out


def jitter(seed: int, steps: int, base_s: float = 0.010, spread_s: float = 0.001) -> list[float]:
    rng = random.Random(seed)
    return [base_s + rng.uniform(-spread_s, spread_s) for _ in range(steps)]


def test_a_rank_that_is_the_last_one_ready_in_every_step_is_the_slowest_in_all_of_them() -> None:
    """Rank 1 computes a 30-ms metric before each forward: chronic, the slowest in every step."""
    late = [r + 0.030 for r in jitter(2, 100)]
    pattern = slowest_ranks([(0, windows(0, jitter(1, 100))), (1, windows(1, late))], STEP_S)
    assert pattern is not None
    assert pattern.steps == 100 and pattern.one_rank == 1 and not pattern.rotates
    assert pattern.share(1) == 1.0 and pattern.share(0) == 0.0
    assert pattern.waited_s == pytest.approx(0.030, abs=0.002)


def test_one_ranks_checkpoint_every_10_steps_among_jitter_is_stalls_not_a_rotation() -> None:
    """Rank 0 saves for 400 ms every 10th step; otherwise either rank is a little late now and then.

    Counted as slowest steps, the saves (rank 0 in 10%) over the jitter that
    decides a third of the others (either rank) read as a rotation whose waits,
    each ten steps long, swamp everything: issue #35's "the slowest rank
    rotates: rank 1 in 31%, rank 0 in 11%" beside the stall that explained it.
    """
    draws = random.Random(5)
    late = [draws.choice((0, 1, None, None, None)) for _ in range(150)]
    ready = {r: [j + (0.004 if late[k] == r else 0.0) for k, j in enumerate(jitter(r, 150, spread_s=0.0002))]
             for r in (0, 1)}  # fmt: skip
    for n in range(10, 150, 10):
        ready[0][n] += 0.400  # the step after the save: rank 0 starts its forward 400 ms late
    pattern = slowest_ranks([(r, windows(r, ready[r])) for r in (0, 1)], STEP_S)
    assert pattern is not None
    assert pattern.stalled == {0: 14} and pattern.steps == 150 - 14, pattern.to_dict()
    assert pattern.waited_s == pytest.approx(0.4 * 0.004, abs=0.0008), pattern.to_dict()  # the jitter's, not the saves'


def test_a_different_rank_last_each_step_is_a_rotation_that_names_no_one_rank() -> None:
    """Whichever rank draws the metric each step is late: means alike, and yet the others wait every step."""
    draws = random.Random(3)
    slow = [draws.randrange(3) for _ in range(120)]
    ranks = [
        (r, windows(r, [j + (0.030 if slow[k] == r else 0.0) for k, j in enumerate(jitter(r, 120))])) for r in range(3)
    ]
    pattern = slowest_ranks(ranks, STEP_S)
    assert pattern is not None and pattern.rotates and pattern.one_rank is None
    assert pattern.decided_steps == 120
    assert all(0.2 < pattern.share(r) < 0.45 for r in range(3)), pattern.to_dict()
    assert [r for r, _ in pattern.by_share()] == sorted(range(3), key=lambda r: (-slow.count(r), r))
    # Each rank waits for the drawn one in the steps it did not draw: ~2/3 of the steps x 30 ms, each.
    assert all(pattern.waited_by_rank[r] == pytest.approx(0.030 * (120 - slow.count(r)) / 120, rel=0.1)
               for r in range(3)), pattern.waited_by_rank  # fmt: skip


def padded_batches(seed: int, steps: int, noise_s: float = 0.002) -> tuple[list[float], list[float], list[int]]:
    """(ready, forward, input elements) of a rank whose batches of 16 texts are padded to their longest, 20-200
    tokens: 0.1 ms a token of forward after 3 ms of loading, each with its own noise."""
    rng = random.Random(seed)
    tokens = [rng.randint(20, 200) for _ in range(steps)]
    forward = [1e-4 * t + rng.uniform(0, noise_s) for t in tokens]
    return [0.003 + rng.uniform(0, noise_s) + f for f in forward], forward, [16 * t for t in tokens]


def test_forwards_that_follow_their_padded_batches_make_a_rotation_read_at_the_backwards_end() -> None:
    """Whichever rank drew the longest batch is last, and its backward (twice its forward) makes it later still.

    At the forward's end the excess is a third of what the others wait, within the noise of forwards that vary
    this much; the inputs' sizes say the variation is the data's, so readiness is read at the backward's end.
    An older reporter's windows (no sizes) keep the forward's end: nothing is assumed of them.
    """
    a, b = padded_batches(1, 120), padded_batches(2, 120)
    pattern = slowest_ranks([(0, windows(0, a[0], forward_s=a[1], numel=a[2])),
                             (1, windows(1, b[0], forward_s=b[1], numel=b[2]))], STEP_S)  # fmt: skip
    assert pattern is not None and pattern.input_driven is not None and pattern.input_driven > 0.9
    assert pattern.rotates and min(pattern.share(0), pattern.share(1)) > 0.25, pattern.to_dict()
    waits = [3 * abs(fa - fb) for fa, fb in zip(a[1], b[1], strict=True)]
    assert pattern.waited_s == pytest.approx(sum(waits) / len(waits), rel=0.25)
    unsized = slowest_ranks([(0, windows(0, a[0], forward_s=a[1])), (1, windows(1, b[0], forward_s=b[1]))], STEP_S)
    assert unsized is not None and unsized.input_driven is None
    assert unsized.waited_s < pattern.waited_s / 2


def test_forwards_that_vary_with_inputs_of_one_size_are_noise_not_the_datas_doing() -> None:
    """A shared CPU makes a healthy job's forwards vary by a quarter; its inputs are all one size: no rotation."""
    rng = random.Random(3)
    ranks = []
    for rank in (0, 1):
        forward = [0.020 * (1 + rng.uniform(-0.25, 0.25)) for _ in range(120)]
        ready = [0.003 + rng.uniform(0, 0.0005) + f for f in forward]
        ranks.append((rank, windows(rank, ready, forward_s=forward, numel=[16 * 128] * 120)))
    pattern = slowest_ranks(ranks, STEP_S)
    assert pattern is not None and pattern.input_driven is None and not pattern.rotates


def test_ranks_doing_the_same_work_tie_and_nobody_is_the_slowest() -> None:
    pattern = slowest_ranks([(r, windows(r, jitter(r, 100))) for r in range(4)], STEP_S)
    assert pattern is not None
    assert pattern.decided_steps == 0 and pattern.one_rank is None and not pattern.rotates
    assert pattern.waited_s == 0.0


def test_the_line_follows_the_jobs_own_jitter_when_that_is_wider_than_a_twentieth_of_the_step() -> None:
    """Ranks whose readiness swings ±6 ms on a 40-ms step (a busy shared machine): the swings are no rotation.

    Against the fixed 2-ms line alone (5% of the step), half the steps would have a slowest rank.
    """
    ranks = [(r, windows(r, jitter(10 + r, 200, spread_s=0.006))) for r in range(2)]
    pattern = slowest_ranks(ranks, STEP_S)
    assert pattern is not None and pattern.line_s > 2 * SLOWEST_LINE_FRAC * STEP_S
    assert not pattern.rotates and pattern.decided_steps < 0.05 * pattern.steps, pattern.to_dict()


def test_steps_are_compared_only_where_the_ranks_kept_the_same_ones() -> None:
    """Rank 1 kept every second step (its windows held more steps): the even steps are compared."""
    late = [r + 0.030 for r in jitter(2, 100)]
    pattern = slowest_ranks([(0, windows(0, jitter(1, 100))), (1, windows(1, late, every=2))], STEP_S)
    assert pattern is not None and pattern.steps == 50 and pattern.one_rank == 1


def test_without_readiness_from_two_ranks_there_is_nothing_to_compare() -> None:
    old = [Window(run_id="r", rank=r, seq=1, t0=0.0, t1=0.5, steps=10, step_total=10) for r in range(2)]
    assert slowest_ranks([(0, old[:1]), (1, old[1:])], STEP_S) is None
    assert slowest_ranks([(0, windows(0, jitter(1, 50)))], STEP_S) is None


def test_a_window_keeps_at_most_its_share_of_steps_and_every_rank_keeps_the_same_ones() -> None:
    """40 steps in one rank's window and 33 in the other's: both keep multiples of 2, at most 32 each."""

    def kept(first: int, count: int) -> list[int]:
        marks = [StepMark(end_s=0.0, duration_s=0.01, loader_wait_s=0.0, batches=1, ready_s=0.004)] * count
        fields = step_fields(marks, None, first_step=first)
        return list(fields["ready_step_numbers"])

    a, b = kept(101, 40), kept(101, 33)
    assert len(a) <= READY_STEPS_KEPT and len(b) <= READY_STEPS_KEPT
    assert set(b) <= set(a) and all(n % 2 == 0 for n in a)
    assert kept(1, 20) == list(range(1, 21))


def test_merged_windows_keep_a_thinned_run_of_the_same_steps() -> None:
    """A recording merges old windows: their readiness thins by step number, as a longer window's would."""
    ws = windows(0, jitter(1, 100))
    merged = merge_windows(ws)
    assert len(merged.ready_s) <= READY_STEPS_KEPT
    assert list(merged.ready_step_numbers) == [n for n in range(1, 101) if n % 4 == 0]
    by_number = dict(zip(merged.ready_step_numbers, merged.ready_s, strict=True))
    assert by_number[40] == ws[3].ready_s[-1]
    assert merged.ready_forward_s == ()  # no forwards timed: none made up
    assert (
        ready_steps_kept([(5, 0.1, -1.0, -1)] * 40) == [(5, 0.1, -1.0, -1)] * READY_STEPS_KEPT
    )  # one number many times: no loop
    timed = windows(0, jitter(1, 100), forward_s=[n / 1e4 for n in range(1, 101)])
    both = merge_windows(timed)
    assert both.ready_step_numbers == merged.ready_step_numbers
    assert both.ready_forward_s == tuple(n / 1e4 for n in both.ready_step_numbers)  # each with its own step's
    assert merge_windows([ws[0], timed[1]]).ready_forward_s == ()  # an older reporter's window among them: none
    sized = merge_windows(windows(0, jitter(1, 100), forward_s=[n / 1e4 for n in range(1, 101)], numel=range(1, 101)))
    assert sized.ready_input_numel == sized.ready_step_numbers  # each step's own input
    assert both.ready_input_numel == ()


def test_readiness_crosses_the_wire_and_a_frame_that_pairs_them_badly_is_refused() -> None:
    (w,) = windows(0, jitter(1, 10))
    assert decode(encode(w)) == w
    frame = encode(w).replace(b'"ready_s":[', b'"ready_s":[0.5,')
    with pytest.raises(ValueError, match="ready_s"):
        decode(frame)
    (timed,) = windows(0, jitter(1, 10), forward_s=jitter(2, 10))
    assert decode(encode(timed)) == timed
    with pytest.raises(ValueError, match="ready_forward_s"):
        decode(encode(timed).replace(b'"ready_forward_s":[', b'"ready_forward_s":[0.5,'))
    (sized,) = windows(0, jitter(1, 10), forward_s=jitter(2, 10), numel=range(10))
    assert decode(encode(sized)) == sized
    with pytest.raises(ValueError, match="ready_input_numel"):
        decode(encode(sized).replace(b'"ready_input_numel":[', b'"ready_input_numel":[5,'))


def test_a_forwards_input_is_found_by_position_keyword_or_inside_a_batch_and_never_raises() -> None:
    class Sized:
        def __init__(self, n: int) -> None:
            self.n = n

        def numel(self) -> int:
            return self.n

    class Broken:
        def numel(self) -> int:
            raise RuntimeError("a tensor subclass that will not say")

    assert input_numel((Sized(6),), {}) == 6
    assert input_numel((), {"input_ids": Sized(7), "mask": Sized(1)}) == 7  # model(**batch)
    assert input_numel(((Sized(8), Sized(1)),), None) == 8 and input_numel(({"x": Sized(9)},), None) == 9
    assert input_numel((), None) == -1 and input_numel(("text",), {}) == -1 and input_numel(([],), {}) == -1
    assert input_numel((Broken(),), {}) == -1


def fsdp2_windows(rank: int, waits_s: Sequence[float], seed: int) -> list[Window]:
    """A rank of an FSDP2-like job, as its reporter builds its windows from the step marks: every step 205 ms
    long (the ranks leave each collective together), readiness a forward's end that the all-gathers line up
    alike on every rank, and ``waits_s[k]`` of step k spent blocked in collectives (the tap's exposed time)."""
    rng = random.Random(seed)
    out = []
    for seq, start in enumerate(range(0, len(waits_s), PER_WINDOW)):
        marks = [
            StepMark(end_s=0.0, duration_s=0.205 + rng.uniform(-0.002, 0.002), loader_wait_s=0.0, batches=1,
                     ready_s=0.090 + rng.uniform(-0.002, 0.002), forward_s=0.05, backward_s=0.08,
                     exposed_comm_s=waits_s[k] + rng.uniform(0.0, 0.002))
            for k in range(start, min(start + PER_WINDOW, len(waits_s)))
        ]  # fmt: skip
        fields = step_fields(marks, None, first_step=start + 1)
        out.append(Window(run_id="r", rank=rank, seq=seq, t0=seq * 2.0, t1=seq * 2.0 + 2.0, **fields))
    return out


def test_under_fsdp2_the_rank_the_others_wait_for_is_the_one_with_the_most_work_between_its_waits() -> None:
    """Issue #45: rank 1 does 22 ms of Python work more than rank 0 in each ~205-ms step.  Its forward ends no
    later than rank 0's (the next step's first all-gather lines them up), so readiness saw a tie in 98% of the
    steps; rank 0 waits those 22 ms in its collectives, and rank 1 is the slowest in every step."""
    ranks = [(0, fsdp2_windows(0, [0.047] * 60, seed=1)), (1, fsdp2_windows(1, [0.025] * 60, seed=2))]
    pattern = slowest_ranks(ranks, 0.205)
    assert pattern is not None and pattern.by_work, pattern
    assert pattern.one_rank == 1 and pattern.share(1) == 1.0, pattern.to_dict()
    assert pattern.waited_by_rank[0] == pytest.approx(0.022, abs=0.003), pattern.to_dict()
    readiness_only = [(r, [msgspec.structs.replace(w, work_step_numbers=(), work_s=()) for w in ws]) for r, ws in ranks]
    old = slowest_ranks(readiness_only, 0.205)
    assert old is not None and not old.by_work and old.one_rank is None  # what readiness told


def test_under_fsdp2_ranks_that_wait_alike_have_no_slowest_rank_in_most_steps() -> None:
    ranks = [(r, fsdp2_windows(r, jitter(10 + r, 60, base_s=0.040, spread_s=0.003), seed=r)) for r in range(4)]
    pattern = slowest_ranks(ranks, 0.205)
    assert pattern is not None and pattern.by_work
    assert pattern.decided_steps < 0.5 * pattern.steps and pattern.one_rank is None, pattern.to_dict()


def test_each_steps_own_work_is_kept_thinned_as_readiness_and_crosses_the_wire() -> None:
    ws = fsdp2_windows(0, [0.03] * 100, seed=3)
    merged = merge_windows(ws)
    assert list(merged.work_step_numbers) == [n for n in range(1, 101) if n % 4 == 0]
    by_number = dict(zip(merged.work_step_numbers, merged.work_s, strict=True))
    assert by_number[40] == ws[3].work_s[-1] and 0.17 < by_number[40] < 0.18
    assert decode(encode(ws[0])) == ws[0]
    with pytest.raises(ValueError, match="work_s"):
        decode(encode(ws[0]).replace(b'"work_s":[', b'"work_s":[0.5,'))
    plain = step_fields([StepMark(end_s=0.0, duration_s=0.01, loader_wait_s=0.0, batches=1)] * 5, None)
    assert "work_s" not in plain  # no collective timed by the tap (DDP, one process): readiness stays the source
