"""The node sampler: one host's NVML readings sent to a remote collector, once a second.

A collector reads its own machine's GPUs; a rank on another host has no GPU
there to join against.  ``python -m gputop.node`` (``gputop agent`` when a user
starts it by hand: a Kubernetes DaemonSet, a Slurm prolog) samples this host's
GPUs with the dashboard's own sampler (``gputop.collect.gpu.sampler``) and sends each
sample as a ``gpus`` frame over the connection kind a reporter uses
(``GPUTOP_ADDR``, the token handshake of ``gputop.auth``, optional TLS).

Local rank 0's reporter starts it when it reports to another machine
(``gputop.reporter.node_sampler``), so NVML and its driver calls never run
inside a training process.  It imports no reporter, no dashboard, no torch.
"""
