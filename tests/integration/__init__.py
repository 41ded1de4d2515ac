"""Real jobs and real systems: torchrun, DDP, Prometheus, network namespaces, installs; seconds per test.

Most of these check plumbing (what arrives, what is installed, what is left
behind, what a command prints), which holds however slowly their job runs:
`make test` runs them four at a time, longest first (conftest.py).  A test that
asserts a verdict on a job it runs now, or a share of time measured on two cores,
is marked ``alone`` and runs one at a time with no other job beside it: another
job would change what it measures (gputop would rightly name that job as sharing
the CPUs).  Those are a few jobs far from their lines, each a feature on top of a
verdict (docs/decisions.md).  CI runs them first, with the fast tier beside them at
a low CPU priority, which takes little but the cycles their ranks leave idle (.ci/run).
How the rules read other real jobs is checked on recordings of them
(tests/unit/test_recorded_verdicts.py); how often a fresh run of each is read
right, under three conditions, by benchmarks/diagnosis_accuracy.py.
"""
