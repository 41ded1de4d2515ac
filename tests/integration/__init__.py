"""Real jobs and real systems: torchrun, DDP, Prometheus, network namespaces, installs; seconds per test."""
