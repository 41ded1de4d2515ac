"""Real jobs and real systems: torchrun, DDP, Prometheus, network namespaces, installs; seconds per test.

Most of these check plumbing (what arrives, what is installed, what is left
behind, what a command prints), which holds however slowly their job runs:
`make test` runs them three at a time.  A test that asserts a verdict on a job it
runs now, or a share of time measured on two cores, is marked ``alone`` and runs
after them with nothing beside it: another job would change what it measures
(gputop would rightly name that job as sharing the CPUs).  Those are three jobs
far from their lines, each a feature on top of a verdict (docs/decisions.md).
How the rules read other real jobs is checked on recordings of them
(tests/unit/test_recorded_verdicts.py); how often a fresh run of each is read
right, under three conditions, by benchmarks/diagnosis_accuracy.py.
"""
