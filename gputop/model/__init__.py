"""The pure data model both sides read: snapshots, samples, the rank-GPU join, and every figure.

No threads, sockets, NVML, psutil, torch or textual here: ``gputop.collect``
fills these types, ``gputop.diagnose``, ``gputop.tui`` and ``gputop.report``
read them.  ``figures.summarize(snapshot)`` is where each number is defined.
"""
